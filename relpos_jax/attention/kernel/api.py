"""``attend``: relative attention through the Pallas kernels, differentiable.

The terms a scheme adds come as tables by distance ``d = q_pos − k_pos`` (ascending, rows
``0 … R − 1``), which is what every Toeplitz scheme is:

* ``logit_rows [N or 1, R, H]`` with the query side ``a [B, T, N, H]`` (in logit units):
  ``a_i · w_{d}`` (Transformer-XL's ``(q + v)·W_R·R``, Shaw's ``q·a^K``);
* ``bias_rows [N, R]``: ``b_{n, d}`` after scaling (T5's buckets, ALiBi, KERPLE);
* ``value_rows [N or 1, R, H]``: ``Σ_j p_ij w_{d_ij}`` added to the output (Shaw's values);

and a term that depends on the query's position too (FIRE's bias), which a scheme evaluates in each
tile (``tile``, a ``common.TileTerm``) from a row of its parameters per head (``tile_rows
[N, 1, 128]``). ``Terms`` holds them; the kernels name no scheme.

Gradients reach q, k, v, ``a``, the three tables and the tile rows (float32; the scheme's parameters
are one ``jax.vjp`` of the tables away). Positions are contiguous (the model's windows): query i and key j
are ``offset + i − j`` apart, ``offset = K − T`` the memory. Query i may attend key j iff
``key_valid[j]`` and ``0 ≤ d ≤ max_distance`` (None: no limit). Dropout (``dropatt``, ``seed``) is
``skew.keep``'s hash of (seed, row, query, key), the same forward and backward.

Legend: B batch, T queries, K = M + T keys, N heads, H head dim, R distances, S block.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp

from relpos_jax.attention.kernel import backward, fit, forward
from relpos_jax.attention.kernel.common import BIAS_WIDTH, F32, SUBLANES, Spec, TileTerm
from relpos_jax.attention.kernel.skew import BACKENDS
from relpos_jax.ops import backend as ops_backend

DEFAULT_BLOCK = {"triton": 64, "mosaic": 128}


def backend_of(platform: str | None = None) -> str | None:
    """The kernel backend of a JAX platform (default: the default backend's): triton on GPU, mosaic
    on TPU, None elsewhere."""
    platform = platform or ops_backend.platform()
    return {"gpu": "triton", "cuda": "triton", "rocm": "triton", "tpu": "mosaic"}.get(platform)


def unavailable(backend: str | None = None) -> str | None:
    """Why the compiled kernels cannot run on the target's chip, in words (None: they can): Mosaic
    has strided rotations, the relative shift of ``skew``, from TPU v5 on."""
    generation = ops_backend.tpu_generation()
    if (backend or backend_of()) == "mosaic" and generation is not None and generation < 5:
        return f"Mosaic on TPU v{generation} has no strided rotation (the kernels need v5 or later)"
    return None


def default_block(backend: str, terms=(), head_dim: int = 64, dtype=jnp.float32,
                  interpret: bool = False) -> int:  # fmt: skip
    """The block a call takes by default: on a GPU the largest whose kernels fit its shared memory
    (``kernel.fit``; at least 16), on a TPU 128 lanes."""
    if backend != "triton" or interpret:
        return DEFAULT_BLOCK[backend]
    return fit.block(terms, head_dim, jnp.dtype(dtype).itemsize) or fit.BLOCKS[-1]


def supports(head_dim: int, block: int) -> bool:
    """Whether the kernels take these sizes: powers of two of at least 16 (Triton's products)."""
    power = lambda x: x >= 16 and x & (x - 1) == 0  # noqa: E731
    return power(head_dim) and power(block)


@functools.partial(
    jax.tree_util.register_dataclass,
    data_fields=["a", "logit_rows", "bias_rows", "value_rows", "tile_rows"],
    meta_fields=["tile"],
)
@dataclasses.dataclass(frozen=True)
class Terms:
    """What a scheme adds to the content attention, as the kernels take it (a pytree: ``tile`` is
    static): ``logit_rows`` with its query side ``a``, ``bias_rows``, ``value_rows``, and a term
    evaluated in each tile, ``tile`` with its ``tile_rows``; None where the scheme has none."""

    a: jax.Array | None = None
    logit_rows: jax.Array | None = None
    bias_rows: jax.Array | None = None
    value_rows: jax.Array | None = None
    tile_rows: jax.Array | None = None
    tile: TileTerm | None = None


def attend(
    q: jax.Array,
    k: jax.Array,
    v: jax.Array,
    terms: Terms = Terms(),  # frozen: a shared default is safe
    *,
    key_valid: jax.Array,
    scale: float,
    max_distance: int | None = None,
    dropatt: float = 0.0,
    seed: jax.Array | None = None,
    block: int | None = None,
    backend: str | None = None,
    interpret: bool = False,
) -> jax.Array:
    """Attention output ``[B, T, N, H]`` in q's dtype (see the module docstring)."""
    a, logit_rows, bias_rows, value_rows = (
        terms.a,
        terms.logit_rows,
        terms.bias_rows,
        terms.value_rows,
    )
    tile_rows = terms.tile_rows
    batch, q_len, heads, head_dim = q.shape
    k_len = k.shape[1]
    backend = backend or backend_of()
    if backend not in BACKENDS:
        raise ValueError(
            f"kernel attention: no Pallas backend on {jax.default_backend()!r}; use a GPU or TPU, "
            "or interpret=True with backend='triton' or 'mosaic'"
        )
    present = fit.terms_of(logit_rows is not None, value_rows is not None, bias_rows is not None,
                           tile_rows is not None)  # fmt: skip
    block = block or default_block(backend, present, head_dim, q.dtype, interpret)
    if not supports(head_dim, block):
        raise ValueError(
            f"kernel attention: head_dim={head_dim} and block={block} must be powers of two ≥ 16"
        )
    if backend == "mosaic" and not interpret and block % 128:
        raise ValueError(
            f"kernel attention: block={block} on a TPU must be a multiple of 128 lanes"
        )
    if (
        backend == "triton"
        and not interpret
        and ops_backend.platform() == "gpu"  # (not when lowered on a CPU host: kernel.cubin)
        and (over := fit.oversized(present, block, head_dim, q.dtype.itemsize))
    ):
        capacity, fitting = over
        raise ValueError(
            f"kernel attention: block={block} at head dim {head_dim} in {q.dtype} needs more "
            f"shared memory than this GPU's {capacity:,} B a block; set "
            f"model.kernel_block={fitting} (or 0: the largest that fits)"
        )
    if not interpret and (why := unavailable(backend)):
        raise ValueError(f"kernel attention: {why}; use the tiled attention")
    if (a is None) != (logit_rows is None):
        raise ValueError("kernel attention: a and logit_rows come together")
    if not 0.0 <= dropatt < 1.0 or (dropatt and seed is None):
        raise ValueError(f"kernel attention: dropatt={dropatt} must be in [0, 1), with a seed")
    tables = [x for x in (logit_rows, bias_rows, value_rows) if x is not None]
    if (terms.tile is None) != (tile_rows is None):
        raise ValueError("kernel attention: tile and tile_rows come together")
    distances = max([x.shape[1] for x in tables], default=1)
    q_blocks, k_blocks = -(-q_len // block), -(-k_len // block)
    spec = Spec(
        backend, block, k_len - q_len, float(scale), max_distance, float(dropatt),
        logit_rows is not None, bias_rows is not None, value_rows is not None, distances, batch,
        heads, q_blocks, k_blocks, interpret, terms.tile,
    )  # fmt: skip
    heads_first = lambda x, length: _pad(x, length, axis=1).transpose(0, 2, 1, 3)  # noqa: E731
    q_p, k_p, v_p = (heads_first(x, n * block) for x, n in ((q, q_blocks), (k, k_blocks),
                                                            (v, k_blocks)))  # fmt: skip
    a_p = None if a is None else heads_first(a, q_blocks * block)
    valid = _pad(jnp.asarray(key_valid, jnp.int32), k_blocks * block, axis=0)[None]
    if bias_rows is not None:  # the bias in lane 0 of a band of width BIAS_WIDTH
        bias_rows = jnp.pad(bias_rows.astype(F32)[..., None], ((0, 0), (0, 0), (0, BIAS_WIDTH - 1)))
    rows, bias, vrows = (
        None if x is None else _descending(x, distances, block)
        for x in (logit_rows, bias_rows, value_rows)
    )
    seed = (
        jnp.zeros((1, 1), jnp.int32) if seed is None else jnp.asarray(seed, jnp.int32).reshape(1, 1)
    )
    tile_rows = None if tile_rows is None else tile_rows.astype(F32)
    out = _attend(spec, q_p, a_p, k_p, v_p, rows, bias, vrows, tile_rows, valid, seed)
    return out[:, :, :q_len].transpose(0, 2, 1, 3)


def _pad(x: jax.Array, length: int, axis: int) -> jax.Array:
    pad = [(0, 0)] * x.ndim
    pad[axis] = (0, length - x.shape[axis])
    return jnp.pad(x, pad)


def _descending(table: jax.Array, distances: int, block: int) -> jax.Array:
    """``[Nt, R, C]`` ascending -> ``[Nt, R + 4S + 8, C]`` float32, row x holding distance
    ``R − 1 + 2S − x`` (zeros beyond the table: they feed only masked pairs; the last 8 rows for
    Mosaic's aligned reads, ``common.rows_of``)."""
    table = _pad(table.astype(F32), distances, axis=1)[:, ::-1]
    return jnp.pad(table, ((0, 0), (2 * block, 2 * block + SUBLANES), (0, 0)))


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _attend(spec: Spec, q, a, k, v, rows, bias, vrows, tile_rows, valid, seed):
    return forward.call(spec, q, a, k, v, valid, rows, bias, vrows, tile_rows, seed)[0]


def _attend_fwd(spec: Spec, q, a, k, v, rows, bias, vrows, tile_rows, valid, seed):
    out, lse = forward.call(spec, q, a, k, v, valid, rows, bias, vrows, tile_rows, seed)
    return out, (q, a, k, v, rows, bias, vrows, tile_rows, valid, seed, out, lse)


def _attend_bwd(spec: Spec, residuals, d_out):
    q, a, k, v, rows, bias, vrows, tile_rows, valid, seed, out, lse = residuals
    d_out = d_out.astype(q.dtype)
    d_rows_sum = jnp.sum(d_out.astype(F32) * out.astype(F32), axis=-1, keepdims=True)
    dq, da, dk, dv, d_rows, d_bias, d_vrows, d_tile = backward.call(
        spec, q, a, k, v, valid, rows, bias, vrows, tile_rows, seed, d_out, lse, d_rows_sum
    )
    like = lambda g, x: None if x is None else g.astype(x.dtype)  # noqa: E731
    return (
        like(dq, q), like(da, a), like(dk, k), like(dv, v), like(d_rows, rows),
        like(d_bias, bias), like(d_vrows, vrows), like(d_tile, tile_rows), None, None,
    )  # fmt: skip


_attend.defvjp(_attend_fwd, _attend_bwd)
