"""Matrix products in the compute dtype with float32 accumulation, in the forward and backward pass.

With ``model.dtype = "bfloat16"`` every matrix product takes bfloat16 operands and accumulates in
float32 (``preferred_element_type``), which is what the hardware's bf16 units do fast: tensor cores
on GPU, the MXU on TPU, AMX or AVX512_BF16 on recent x86 CPUs (a bf16 × bf16 → f32 product runs ~5×
faster than float32 on a Sapphire Rapids core, ~2× on a Zen 4 core, while a plain bf16 × bf16 → bf16
product does not).
JAX's own transpose rule would do the backward products in float32, since the cotangent of a
float32-accumulated product is float32, so ``einsum`` has a custom VJP that casts the cotangent to
the compute dtype and does both backward products the same way. Float32 products take the same path
(for the operand layouts below, 8% faster training on CPU); float64 ones, the references', are
``jnp.einsum``. Parameters stay float32 (master weights); the model casts them to the compute dtype
where it uses them.

On a CPU each product is laid out for XLA:CPU's fast kernels (``_product``); on GPU and TPU, whose
libraries read operands in any layout, it is ``jnp.einsum`` with float32 accumulation.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp

from relpos_jax.ops import backend


def einsum(spec: str, a: jax.Array, b: jax.Array, out_dtype=None) -> jax.Array:
    """``jnp.einsum(spec, a, b)`` of two operands, accumulated in float32; the result in the wider of
    ``out_dtype`` and the operands' dtype (float64 stays float64). Every index of one operand must
    appear in the other or in the output (no index summed inside one operand), which holds for every
    product of the model."""
    compute = jnp.promote_types(a.dtype, b.dtype)
    out_dtype = compute if out_dtype is None else jnp.promote_types(out_dtype, compute)
    if compute == jnp.float64:
        return jnp.einsum(spec, a, b).astype(out_dtype)
    _check(spec)
    return _mixed(spec, out_dtype, a.astype(compute), b.astype(compute))


def logits(spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
    """``einsum`` with a float32 result (at least): attention logits, whatever the inputs' dtype."""
    return einsum(spec, a, b, out_dtype=jnp.float32)


def dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None, **_):
    """A ``dot_general`` for ``nnx.Linear`` (the last axis of ``lhs`` with the first of ``rhs``)."""
    (contract_lhs, contract_rhs), batch = dimension_numbers
    if batch != ((), ()) or contract_lhs != (lhs.ndim - 1,) or contract_rhs != (0,):
        return jax.lax.dot_general(lhs, rhs, dimension_numbers, precision, preferred_element_type)
    letters = "abcdefghijklm"[: lhs.ndim - 1]
    return einsum(f"{letters}y,yz->{letters}z", lhs, rhs, preferred_element_type)


@functools.partial(jax.custom_jvp, nondiff_argnums=(1,))
def concatenate(arrays: list[jax.Array], axis: int) -> jax.Array:
    """``jnp.concatenate`` that moves 16-bit floats as 16-bit integers (bit for bit the same).

    XLA:CPU has no bf16 concatenation: it converts every operand to float32, concatenates and
    converts back, three passes over the data where one copy would do. Differentiable: tangents
    and cotangents take ``jnp.concatenate`` (a bit cast alone would give a zero gradient)."""
    bits = jnp.concatenate([_as_bits(x) for x in arrays], axis=axis)
    return _from_bits(bits, arrays[0].dtype)


@concatenate.defjvp
def _concatenate_jvp(axis, primals, tangents):
    (arrays,), (array_tangents,) = primals, tangents
    return concatenate(arrays, axis), jnp.concatenate(array_tangents, axis=axis)


@jax.custom_jvp
def append_last(a: jax.Array, b: jax.Array) -> jax.Array:
    """``concatenate([a, b], axis=-1)`` as ``a`` padded, then ``b`` written into the pad in place.

    Where ``a`` is one layer's slice of a stacked memory, XLA:CPU copies the slice out and then
    copies it again into a concatenation; a pad reads the slice where it lies (txl_small's
    evaluation with 2,100 memory slots: 55 against 162 ms of copies per step). Differentiable
    like ``concatenate``."""
    return _from_bits(_append_last(_as_bits(a), _as_bits(b)), a.dtype)


@append_last.defjvp
def _append_last_jvp(primals, tangents):
    (a, b), (ta, tb) = primals, tangents
    return append_last(a, b), _append_last(ta, tb)


def _append_last(a: jax.Array, b: jax.Array) -> jax.Array:
    padded = jnp.pad(a, [(0, 0)] * (a.ndim - 1) + [(0, b.shape[-1])])
    return jax.lax.dynamic_update_slice(padded, b, (0,) * (a.ndim - 1) + (a.shape[-1],))


def _as_bits(x: jax.Array) -> jax.Array:
    if x.dtype.itemsize == 2 and jnp.issubdtype(x.dtype, jnp.floating):
        return jax.lax.bitcast_convert_type(x, jnp.uint16)
    return x


def _from_bits(x: jax.Array, dtype) -> jax.Array:
    return x if x.dtype == dtype else jax.lax.bitcast_convert_type(x, dtype)


def add_bias(x: jax.Array, bias: jax.Array) -> jax.Array:
    """``x + bias``, the bias broadcast over the leading axes of ``x`` and cast to its dtype.

    The bias gradient is ``sum_leading`` of the cotangent, accumulated in float32. JAX's own rule
    sums a bf16 cotangent in bf16, which XLA:CPU turns into a slow ``reduce-window`` (18× slower than
    a float32 sum at [2048, 1024]) and which loses precision; and for a bias broadcast over a few
    long rows (T5's ``[N, T, K]`` over the batch) its reduction is 20× slower than needed. In
    float64 (the references) it is ``x + bias``."""
    if bias.shape != x.shape[x.ndim - bias.ndim :]:
        raise ValueError(f"add_bias: bias.shape={bias.shape} must be the last axes of {x.shape}")
    if x.dtype == jnp.float64:
        return x + bias.astype(x.dtype)
    return _add_bias(x, bias)


def sum_leading(x: jax.Array, count: int) -> jax.Array:
    """``x`` summed over its first ``count`` axes with float32 accumulation, as a float32 array.

    XLA:CPU reduces a few long rows slowly: ``[8, 131072].sum(0)`` takes 4.6 ms, 20× the time of
    the same sum as a product with a vector of ones (0.23 ms); many short rows (``[2048, 1024]``)
    it reduces well. So on a CPU, fewer rows than columns are summed by that product (float32
    operands at full precision), and more by ``jnp.sum``."""
    shape = x.shape[count:]
    rows = math.prod(x.shape[:count])
    flat = x.reshape(rows, math.prod(shape))
    if backend.on_cpu() and rows < flat.shape[1]:
        flat = flat.astype(jnp.float32)
        total = jax.lax.dot_general(
            jnp.ones(rows, jnp.float32), flat, (((0,), (0,)), ((), ())),
            precision=jax.lax.Precision.HIGHEST, preferred_element_type=jnp.float32,
        )  # fmt: skip
    else:
        total = jnp.sum(flat, axis=0, dtype=jnp.float32)
    return total.reshape(shape)


@jax.custom_vjp
def _add_bias(x: jax.Array, bias: jax.Array) -> jax.Array:
    return x + bias.astype(x.dtype)


def _add_bias_forward(x, bias):
    return _add_bias(x, bias), bias


def _add_bias_backward(bias, cotangent):
    leading = cotangent.ndim - bias.ndim
    return cotangent, sum_leading(cotangent, leading).astype(bias.dtype)


_add_bias.defvjp(_add_bias_forward, _add_bias_backward)


def _check(spec: str) -> None:
    inputs, out = spec.replace(" ", "").split("->")
    lhs, rhs = inputs.split(",")
    for name, operand, others in (("first", lhs, rhs + out), ("second", rhs, lhs + out)):
        if len(set(operand)) != len(operand) or not set(operand) <= set(others):
            raise ValueError(
                f"precision.einsum: spec={spec!r} is invalid for the {name} operand; every index "
                "must appear once in it and also in the other operand or the output"
            )


def _product(spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
    """``einsum(spec, a, b)`` accumulated in float32, as one ``dot_general`` of operands whose batch,
    contracted and free axes are each merged into one axis.

    XLA:CPU runs a bf16 × bf16 → f32 product on its fast kernels (AMX or AVX512_BF16) only if,
    once XLA has folded transpositions into it, the left operand is ``[batch, rows, contracted]``
    and neither operand is column-major; otherwise it converts both operands to float32 (about 6×
    slower) or, for some forms, fails (``Unsupported element type for DotThunk``). So the left
    operand is copied to ``[batch, rows, contracted]`` when it is not already, and the copy is
    reshaped with its groups of axes merged, which XLA cannot fold back into the product. The right
    operand is read in place (``[batch, contracted, columns]`` and ``[batch, columns, contracted]``
    are equally fast) when each of its groups of axes is contiguous, and copied if not, to whichever
    of the two keeps its last axis last (a copy of whole rows, not single elements).

    Either operand may go on the left (the product then comes out with its free axes swapped): the
    order whose copies cost less is taken, a copy that moves the last axis counting 4× its bytes.
    XLA:CPU fuses the elementwise operations that produce an operand into its transposition, and
    such a fused transposition runs untiled, up to 7× slower than a plain one (float32
    ``[1024, 1024]`` after a ReLU: 7.5 ms against 1.1 ms; a copy that keeps the last axis moves whole
    rows). A weight gradient ``[BT, F]ᵀ·[BT, D]`` thus transposes the ``[BT, D]`` side and the
    ``[D, F]`` result rather than the ``[BT, F]`` side.
    """
    if not backend.on_cpu():
        return jnp.einsum(spec, a, b, preferred_element_type=jnp.float32)
    inputs, out = spec.replace(" ", "").split("->")
    lhs, rhs = inputs.split(",")
    size = dict(zip(lhs, a.shape, strict=True)) | dict(zip(rhs, b.shape, strict=True))
    plan = _Plan(lhs, rhs, out, size, a.dtype.itemsize, b.dtype.itemsize)
    swapped = _Plan(rhs, lhs, out, size, b.dtype.itemsize, a.dtype.itemsize)
    if swapped.copied_bytes < plan.copied_bytes:
        a, b, plan = b, a, swapped
    a = _transposed(a, plan.lhs, plan.lhs_order)
    b = _transposed(b, plan.rhs, plan.rhs_order)

    def merged(x, names):
        return x.reshape([math.prod(size[c] for c in plan.groups[g]) for g in names])

    batch = ((0,), (plan.rhs_groups.index("batch"),)) if plan.groups["batch"] else ((), ())
    contract = ((plan.lhs_groups.index("summed"),), (plan.rhs_groups.index("summed"),))
    c = jax.lax.dot_general(
        merged(a, plan.lhs_groups),
        merged(b, plan.rhs_groups),
        (contract, batch),
        preferred_element_type=jnp.float32,
    )
    c = c.reshape([size[x] for x in plan.result])
    if plan.result == out:
        return c
    return jnp.einsum(f"{plan.result}->{out}", jax.lax.optimization_barrier(c))


# A copy that changes the last axis moves single elements, not rows: measured 3× (alone) to 7×
# (fused with the elementwise producer) slower per byte than a copy that keeps it.
_TRANSPOSED_LAST_AXIS = 4


class _Plan:
    """How ``_product`` lays out ``lhs,rhs->out`` with ``lhs`` on the left, and the bytes it copies."""

    def __init__(self, lhs: str, rhs: str, out: str, size: dict, lhs_bytes: int, rhs_bytes: int):
        self.lhs, self.rhs = lhs, rhs
        self.groups = {  # batch and contracted axes in the right operand's order
            "batch": [c for c in rhs if c in lhs and c in out],
            "summed": [c for c in rhs if c in lhs and c not in out],
            "rows": [c for c in lhs if c not in rhs],
            "columns": [c for c in rhs if c not in lhs],
        }
        self.rhs_groups = _contiguous_groups(rhs, self.groups)
        if self.rhs_groups is None:  # copied: keep its last axis last if either order can
            orders = [("batch", "summed", "columns"), ("batch", "columns", "summed")]
            orders.sort(key=lambda order: [c for g in order for c in self.groups[g]][-1] != rhs[-1])
            self.rhs_groups = [g for g in orders[0] if self.groups[g]]
        self.rhs_order = "".join(c for g in self.rhs_groups for c in self.groups[g])
        self.lhs_groups = [g for g in ("batch", "rows", "summed") if self.groups[g]]
        self.lhs_order = "".join(c for g in self.lhs_groups for c in self.groups[g])
        self.result = "".join(self.groups["batch"] + self.groups["rows"] + self.groups["columns"])

        def cost(order, new_order, item_bytes):  # a copy that moves the last axis costs 4×
            if order == new_order:
                return 0
            weight = 1 if order[-1] == new_order[-1] else _TRANSPOSED_LAST_AXIS
            return weight * item_bytes * math.prod(size[c] for c in order)

        self.copied_bytes = (
            cost(lhs, self.lhs_order, lhs_bytes)
            + cost(rhs, self.rhs_order, rhs_bytes)
            + cost(self.result, out, 4)  # the float32 product
        )


def _contiguous_groups(letters: str, groups: dict[str, list[str]]) -> list[str] | None:
    """The groups of ``letters`` in order, if each group's axes are adjacent and in the group's
    order; else None."""
    group_of = {c: g for g, members in groups.items() for c in members}
    sequence = []
    for c in letters:
        if not sequence or sequence[-1] != group_of[c]:
            sequence.append(group_of[c])
    if len(sequence) != len(set(sequence)):
        return None
    if any("".join(groups[g]) not in letters for g in sequence):
        return None
    return sequence


def _transposed(x: jax.Array, order: str, new_order: str) -> jax.Array:
    """``x`` with its axes in ``new_order``, as a copy. The barrier alone does not keep XLA:CPU from
    folding the transposition back into a product (it removes barriers early); ``_product``'s
    reshape that merges the copy's axes does."""
    if order == new_order:
        return x
    return jax.lax.optimization_barrier(jnp.einsum(f"{order}->{new_order}", x))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _mixed(spec: str, out_dtype, a: jax.Array, b: jax.Array) -> jax.Array:
    return _product(spec, a, b).astype(out_dtype)


def _mixed_forward(spec, out_dtype, a, b):
    return _mixed(spec, out_dtype, a, b), (a, b)


def _mixed_backward(spec, out_dtype, residuals, cotangent):
    a, b = residuals
    inputs, out = spec.replace(" ", "").split("->")
    lhs, rhs = inputs.split(",")
    g = cotangent.astype(a.dtype)
    grad_a = _product(f"{out},{rhs}->{lhs}", g, b)
    grad_b = _product(f"{lhs},{out}->{rhs}", a, g)
    return grad_a.astype(a.dtype), grad_b.astype(b.dtype)


_mixed.defvjp(_mixed_forward, _mixed_backward)
