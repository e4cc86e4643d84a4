"""Mixed-precision products: float32 accumulation forward and backward, float32/64 untouched."""

from __future__ import annotations

import functools
import math
import re

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from relpos_jax import TransformerLM
from relpos_jax.ops import precision

SPECS = [("btd,dnh->btnh", (2, 5, 8), (8, 3, 4)), ("bqnh,bknh->bnqk", (2, 5, 3, 4), (2, 7, 3, 4))]


@pytest.mark.parametrize(("spec", "a_shape", "b_shape"), SPECS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.float64])
def test_full_precision_is_plain_einsum(spec, a_shape, b_shape, dtype, rng, x64):
    a, b = (jnp.asarray(rng.normal(size=s), dtype) for s in (a_shape, b_shape))
    got = precision.einsum(spec, a, b, out_dtype=jnp.float32)
    assert got.dtype == dtype  # never narrower than the operands
    np.testing.assert_array_equal(got, jnp.einsum(spec, a, b))


@pytest.mark.parametrize(("spec", "a_shape", "b_shape"), SPECS)
def test_bfloat16_matches_float32_on_rounded_inputs_forward_and_backward(
    spec, a_shape, b_shape, rng
):
    a, b = (jnp.asarray(rng.normal(size=s), jnp.bfloat16) for s in (a_shape, b_shape))
    weights = jnp.asarray(rng.normal(size=jnp.einsum(spec, a, b).shape), jnp.float32)

    def loss(f, a, b):
        return jnp.sum(f(spec, a, b).astype(jnp.float32) * weights)

    mixed = precision.einsum(spec, a, b, out_dtype=jnp.float32)
    exact = jnp.einsum(spec, a.astype(jnp.float32), b.astype(jnp.float32))
    assert mixed.dtype == jnp.float32
    np.testing.assert_allclose(mixed, exact, rtol=1e-5, atol=1e-5)  # accumulated in float32
    grads = jax.grad(lambda a, b: loss(precision.einsum, a, b), argnums=(0, 1))(a, b)
    want = jax.grad(lambda a, b: loss(jnp.einsum, a, b), argnums=(0, 1))(
        a.astype(jnp.float32), b.astype(jnp.float32)
    )
    for g, w, x in zip(grads, want, (a, b), strict=True):
        assert g.dtype == x.dtype == jnp.bfloat16
        np.testing.assert_allclose(g.astype(jnp.float32), w, rtol=2e-2, atol=2e-2)


# The model's products and their gradients' (forward specs with their transposes), in shapes where
# either operand may be put on the left.
MODEL_SPECS = [
    ("aby,yz->abz", (2, 6, 16), (16, 4)),  # dense
    ("aby,abz->yz", (2, 6, 16), (2, 6, 4)),  # its weight gradient: [BT, F]ᵀ·[BT, D]
    ("abz,aby->yz", (2, 6, 4), (2, 6, 16)),
    ("bkd,dsnh->sbknh", (2, 5, 8), (8, 2, 3, 4)),  # fused key/value projection
    ("bkd,sbknh->dsnh", (2, 5, 8), (2, 2, 5, 3, 4)),
    ("bqnh,knh->bnqk", (2, 5, 3, 4), (7, 3, 4)),  # Transformer-XL position term
    ("bnqk,bqnh->knh", (2, 3, 5, 7), (2, 5, 3, 4)),
    ("bnqk,knh->bqnh", (2, 3, 5, 7), (7, 3, 4)),
    ("bnqk,bknh->bqnh", (2, 3, 5, 7), (2, 7, 3, 4)),  # weights · values
    ("bkd,dsnh->sbnhk", (2, 5, 8), (8, 2, 3, 4)),  # keys and values as columns (attention.py)
    ("bkd,sbnhk->dsnh", (2, 5, 8), (2, 2, 3, 4, 5)),
    ("sbnhk,dsnh->bkd", (2, 2, 3, 4, 5), (8, 2, 3, 4)),
    ("bqnh,bnhk->bnqk", (2, 5, 3, 4), (2, 3, 4, 7)),
    ("bnqk,bqnh->bnhk", (2, 3, 5, 7), (2, 5, 3, 4)),
    ("bnqk,bnhk->bqnh", (2, 3, 5, 7), (2, 3, 4, 7)),
]


@pytest.mark.parametrize(("spec", "a_shape", "b_shape"), MODEL_SPECS)
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_every_operand_order_computes_the_einsum(spec, a_shape, b_shape, dtype, rng):
    a, b = (jnp.asarray(rng.normal(size=s), dtype) for s in (a_shape, b_shape))
    exact = np.einsum(spec, np.asarray(a, np.float64), np.asarray(b, np.float64))
    got = precision._product(spec, a, b)
    assert got.dtype == jnp.float32 and got.shape == exact.shape
    np.testing.assert_allclose(got, exact, rtol=1e-5, atol=1e-5)
    inputs, out = spec.split("->")
    lhs, rhs = inputs.split(",")
    swapped = precision._product(f"{rhs},{lhs}->{out}", b, a)  # the other plan chosen first
    np.testing.assert_allclose(swapped, exact, rtol=1e-5, atol=1e-5)


def test_a_weight_gradient_transposes_its_narrow_side():
    """[BT, F]ᵀ·[BT, D] with F = 4·D: transposing the [BT, D] side and the [D, F] result copies
    half the bytes of transposing [BT, F], so the narrow side goes on the left."""
    size = dict(a=8, b=128, y=1024, z=256)
    wide_left = precision._Plan("aby", "abz", "yz", size, 4, 4)
    narrow_left = precision._Plan("abz", "aby", "yz", size, 4, 4)
    assert narrow_left.copied_bytes < wide_left.copied_bytes
    assert (narrow_left.lhs_order, narrow_left.rhs_order) == ("zab", "aby")  # [BT, F] in place
    assert narrow_left.result == "zy"


def test_a_copied_right_operand_keeps_its_last_axis():
    """The keys of q·kᵀ (``bknh``) are copied to ``bnkh`` (whole rows of H), not ``bnhk``."""
    size = dict(b=8, q=128, k=256, n=4, h=64)
    plan = precision._Plan("bqnh", "bknh", "bnqk", size, 2, 2)
    assert (plan.lhs_order, plan.rhs_order, plan.result) == ("bnqh", "bnkh", "bnqk")


def test_backward_products_take_bfloat16_operands():
    """The reason for the custom VJP: JAX's own rule would multiply in float32."""
    a, b = jnp.ones((4, 8), jnp.bfloat16), jnp.ones((8, 6), jnp.float32)

    def loss(b):
        return precision.einsum("ik,kj->ij", a, b.astype(jnp.bfloat16), jnp.float32).sum()

    text = jax.jit(jax.grad(loss)).lower(b).as_text()
    dots = re.findall(r"stablehlo.dot_general.*?: \((tensor<[^)]*)\)", text)
    assert dots and all("f32" not in operands for operands in dots), dots


def test_bias_gradient_is_summed_in_float32():
    """``add_bias``: in bf16 the bias gradient is a float32 sum of the bf16 cotangent (no bf16
    reduction, which XLA:CPU lowers to a slow reduce-window); in float32 it is ``x + bias``."""
    x = jax.random.normal(jax.random.key(0), (16, 128, 3, 8))
    bias = jax.random.normal(jax.random.key(1), (3, 8))
    weights = jax.random.normal(jax.random.key(2), x.shape).astype(jnp.bfloat16)

    def loss(bias, x):
        return (precision.add_bias(x, bias).astype(jnp.float32) * weights).sum()

    exact = weights.astype(jnp.float32).sum((0, 1))  # the cotangent is exactly bf16 weights
    grad = jax.jit(jax.grad(loss))(bias, x.astype(jnp.bfloat16))
    assert grad.dtype == jnp.float32
    np.testing.assert_allclose(grad, exact, rtol=1e-5, atol=1e-4)
    hlo = jax.jit(jax.grad(loss)).lower(bias, x.astype(jnp.bfloat16)).compile().as_text()
    assert "reduce-window" not in hlo
    np.testing.assert_array_equal(precision.add_bias(x, bias), x + bias)
    np.testing.assert_allclose(jax.grad(loss)(bias, x), exact, rtol=1e-6, atol=1e-5)
    with pytest.raises(ValueError, match=r"add_bias: bias\.shape"):
        precision.add_bias(x, bias.T)


@pytest.mark.parametrize("shape", [(8, 4, 16, 32), (256, 8), (3, 5, 7)])
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
def test_sum_leading_equals_a_float64_sum(shape, dtype):
    """Few long rows (summed by a product with ones on a CPU) and many short rows alike."""
    x = jax.random.normal(jax.random.key(3), shape).astype(dtype)
    for count in range(1, len(shape)):
        total = jax.jit(precision.sum_leading, static_argnums=1)(x, count)
        exact = np.asarray(x, np.float64).sum(tuple(range(count)))
        assert total.dtype == jnp.float32 and total.shape == shape[count:]
        np.testing.assert_allclose(total, exact, rtol=1e-6, atol=1e-5)


def test_bias_over_the_batch_has_the_gradient_of_the_broadcast():
    """T5's ``[N, T, K]`` bias added to ``[B, N, T, K]`` logits: the gradient of ``x + bias``."""
    x = jax.random.normal(jax.random.key(0), (4, 2, 8, 16))
    bias = jax.random.normal(jax.random.key(1), (2, 8, 16))
    weights = jax.random.normal(jax.random.key(2), x.shape)

    def loss(add, bias):
        return (jnp.tanh(add(x, bias)) * weights).sum()

    ours = jax.jit(jax.grad(functools.partial(loss, precision.add_bias), argnums=0))(bias)
    plain = jax.grad(functools.partial(loss, lambda x, b: x + b), argnums=0)(bias)
    np.testing.assert_allclose(ours, plain, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float16, jnp.float32, jnp.int32])
def test_concatenations_are_jnp_concatenate_bit_for_bit(dtype):
    """16-bit floats move as integers: NaN, infinities, −0 and subnormals come through unchanged."""
    special = jnp.array([jnp.nan, jnp.inf, -jnp.inf, -0.0, 1e-40, 3.0]).astype(dtype)
    a = jnp.concatenate([special, jnp.arange(18).astype(dtype)]).reshape(2, 3, 4)
    b = (jnp.arange(30) - 7).astype(dtype).reshape(2, 3, 5)
    want = np.asarray(jnp.concatenate([a, b], axis=-1))
    for got in (
        jax.jit(precision.append_last)(a, b),
        jax.jit(precision.concatenate, static_argnums=1)([a, b], -1),
    ):
        assert got.dtype == dtype
        np.testing.assert_array_equal(np.asarray(got).view(np.uint8), want.view(np.uint8))
    stacked = jax.jit(precision.concatenate, static_argnums=1)([a[None], a[None]], 0)
    np.testing.assert_array_equal(
        np.asarray(stacked).view(np.uint8), np.stack([want[..., :4]] * 2).view(np.uint8)
    )


@pytest.mark.parametrize("dtype", [jnp.bfloat16, jnp.float32])
def test_concatenations_have_jnp_concatenates_gradients(dtype):
    """A bit cast has no derivative: without their own rule these would give zero gradients."""
    a = jax.random.normal(jax.random.key(0), (2, 3, 4)).astype(dtype)
    b = jax.random.normal(jax.random.key(1), (2, 3, 5)).astype(dtype)
    weights = jax.random.normal(jax.random.key(2), (2, 3, 9))

    def loss(concatenation):
        return lambda a, b: (concatenation(a, b).astype(jnp.float32) * weights).sum()

    want = jax.grad(loss(lambda a, b: jnp.concatenate([a, b], -1)), (0, 1))(a, b)
    for concatenation in (
        precision.append_last,
        lambda a, b: precision.concatenate([a, b], -1),
    ):
        got = jax.jit(jax.grad(loss(concatenation), (0, 1)))(a, b)
        for g, w in zip(got, want, strict=True):
            assert g.dtype == dtype
            np.testing.assert_array_equal(np.asarray(g, np.float32), np.asarray(w, np.float32))
    value, tangent = jax.jvp(lambda a, b: precision.append_last(a, b), (a, b), (a, b))
    np.testing.assert_array_equal(np.asarray(tangent, np.float32), np.asarray(value, np.float32))


def test_an_index_summed_inside_one_operand_is_refused():
    x = jnp.ones((2, 3), jnp.bfloat16)
    with pytest.raises(ValueError, match="spec='ij,jk->k' is invalid for the first operand"):
        precision.einsum("ij,jk->k", x, x.T)


def test_bfloat16_model_trains_like_float32():
    config = dict(position="txl", n_layers=2, d_model=32, n_heads=2, d_ff=64, mem_len=8)
    tokens = jax.random.randint(jax.random.key(0), (2, 16), 0, 256)
    losses = {}
    for dtype in ("float32", "bfloat16"):
        model = TransformerLM({**config, "dtype": dtype}, rngs=nnx.Rngs(0))

        def loss(model):
            logits, _ = model(tokens[:, :-1])
            return -jnp.mean(jax.nn.log_softmax(logits)[..., tokens[:, 1:]])

        value, grads = nnx.jit(nnx.value_and_grad(loss))(model)
        leaves = jax.tree.leaves(grads)
        assert all(g.dtype == jnp.float32 for g in leaves)  # float32 master weights
        assert all(bool(jnp.isfinite(g).all()) for g in leaves)
        losses[dtype] = float(value)
    assert abs(losses["bfloat16"] - losses["float32"]) < 0.02 * abs(losses["float32"])


def _compiled_products(hlo: str) -> list[tuple[str, int]]:
    """(left operand's dtype, FLOPs) of every ``dot`` in compiled HLO text."""
    shapes = {}  # instruction name -> (dtype, dims); names are unique in a module
    for name, dtype, dims in re.findall(r"%([\w.-]+) = (\w+)\[([\d,]*)\]", hlo):
        shapes[name] = (dtype, [int(d) for d in dims.split(",") if d])
    products = []
    for out_dims, lhs, contracted in re.findall(
        r"= \w+\[([\d,]*)\]\S* dot\(%([\w.-]+), .*?lhs_contracting_dims=\{([\d,]*)\}", hlo
    ):
        dtype, lhs_dims = shapes[lhs]
        depth = math.prod(lhs_dims[int(i)] for i in contracted.split(","))
        products.append((dtype, 2 * math.prod(int(d) for d in out_dims.split(",")) * depth))
    return products


@pytest.mark.skipif(jax.default_backend() != "cpu", reason="XLA:CPU's kernels and HLO")
@pytest.mark.parametrize("position", ["txl", "rope", "t5"])
def test_compiled_bfloat16_training_step_multiplies_in_bfloat16(position):
    """XLA:CPU converts a product's operands to float32 (about 6× slower on AMX) when it cannot
    run them in bf16, e.g. when a transposition was folded into the left operand. In the compiled
    training gradient (forward and backward) of a bf16 model, at least 99% of the product FLOPs
    must take bf16 operands."""
    config = dict(
        position=position, n_layers=2, d_model=64, n_heads=2, d_ff=256, mem_len=32,
        dropout=0.1, dtype="bfloat16",
    )  # fmt: skip
    model = TransformerLM(config, rngs=nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.key(0), (4, 33), 0, 256)
    mems = model.init_mems(4)
    graphdef, state = nnx.split(model)

    def loss(model):
        logits, _ = model(tokens[:, :-1], mems, deterministic=False)
        return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

    def gradient(state):
        return nnx.grad(loss)(nnx.merge(graphdef, state))

    hlo = jax.jit(gradient).lower(state).compile().as_text()
    products = _compiled_products(hlo)
    total = sum(flops for _, flops in products)
    in_float32 = [(dtype, flops) for dtype, flops in products if dtype != "bf16"]
    assert len(products) > 20
    assert sum(flops for _, flops in in_float32) < 0.01 * total, in_float32
