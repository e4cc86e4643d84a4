"""Transformer-XL relative positions (Dai et al. 2019, arXiv 1901.02860, section 3.3).

The score between query i and key j is

    A_ij = (q_i + u)ᵀ k_j  +  (q_i + v)ᵀ W_R R_{i−j}

with R a sinusoid of the distance i − j (no learned table), W_R its own projection and u, v global
biases. This module gives the position half: the sinusoid for the distances of a window and the term
``(q_i + v)ᵀ W_R R_{i−j}`` computed the paper's fast way. Project ``R`` once for every distance the
window holds (``Tk − 1 … 0``, Tk = memory + segment), score every query against every distance
(``[Tq, Tk]``), then ``rel_shift`` slides row i so that column j holds distance ``Tq − 1 − i + j`` back
from the last key, i.e. distance ``(Tk − Tq + i) − j``. No ``[Tq, Tk, H]`` tensor is ever built.

Legend: B batch, Q/K time (queries, keys), N heads, H head dim, D model dim.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from relpos_jax.positions import _checks
from relpos_jax.positions.absolute import sinusoid


def relative_distances(k_len: int, clamp_len: int | None = None) -> jax.Array:
    """Distances ``Tk − 1 … 0`` (the column order ``rel_shift`` expects), capped at ``clamp_len``."""
    _checks.positive_int("relative_distances", "k_len", k_len)
    distances = jnp.arange(k_len - 1, -1, -1)
    if clamp_len is not None:
        _checks.positive_int("relative_distances", "clamp_len", clamp_len)
        distances = jnp.minimum(distances, clamp_len)
    return distances


def relative_sinusoid(
    k_len: int, dim: int, clamp_len: int | None = None, base: float = 10000.0
) -> jax.Array:
    """``R [Tk, dim]``: the sinusoid of distances ``Tk − 1 … 0``, capped at ``clamp_len``."""
    return sinusoid(relative_distances(k_len, clamp_len), dim, base)


def rel_shift(x: jax.Array) -> jax.Array:
    """The Transformer-XL pad-reshape-slice shift on the last two axes ``[..., Tq, Tk]``.

    Column c of ``x`` holds relative distance ``Tk − 1 − c``. The result ``y`` has
    ``y[..., i, j] = x[..., i, j + Tq − 1 − i]`` wherever ``j ≤ i + (Tk − Tq)`` (the causal part; the
    other entries hold values of neighbouring rows and must be masked).

    The paper pads a zero column, reads the ``[Tq, Tk + 1]`` block as ``[Tk + 1, Tq]``, drops its first
    row and reads the rest as ``[Tq, Tk]``. Here each ``[Tq, Tk]`` block is one gather with indices
    fixed at trace time, and the backward pass is the exact transpose, another such gather: XLA:CPU
    fuses the reshapes into the neighbouring operations as per-element divisions, 2.9× slower for
    the backward pass fused with its layout copy (one core, bf16 ``[8, 4, 128, 256]``: 4.1 → 1.4 ms).
    """
    _checks.ndim("rel_shift", "x", x, tuple(range(2, 9)), "[..., Tq, Tk]")
    return _rel_shift(x)


def _gather_block(x: jax.Array, source: np.ndarray, valid: np.ndarray) -> jax.Array:
    """``y[..., i, j] = x[..., flat source[i, j]]`` within each ``[Tq, Tk]`` block, 0 where not valid."""
    *lead, q_len, k_len = x.shape
    flat = x.reshape(*lead, q_len * k_len)
    taken = jnp.take(flat, np.maximum(source, 0), axis=-1, mode="clip")
    return jnp.where(valid, taken, jnp.zeros((), x.dtype))


@jax.custom_vjp
def _rel_shift(x: jax.Array) -> jax.Array:
    q_len, k_len = x.shape[-2:]
    padded = np.arange(q_len)[:, None] * k_len + np.arange(k_len) + q_len  # in the padded block
    row, col = np.divmod(padded, k_len + 1)  # column 0 is the zero padding
    return _gather_block(x, row * k_len + col - 1, col >= 1)


def _rel_shift_forward(x: jax.Array):
    return _rel_shift(x), None


def _rel_shift_backward(_, cotangent: jax.Array):
    """Element ``[i, c]`` of ``x`` lands at flat position ``i·(Tk + 1) + c + 1 − Tq`` of the result's
    block, or is dropped where that is negative."""
    q_len, k_len = cotangent.shape[-2:]
    source = np.arange(q_len)[:, None] * (k_len + 1) + np.arange(k_len) + 1 - q_len
    return (_gather_block(cotangent, source, source >= 0),)


_rel_shift.defvjp(_rel_shift_forward, _rel_shift_backward)


def position_logits(
    q_BQNH: jax.Array, r_KNH: jax.Array, v_NH: jax.Array | None = None, *, einsum=jnp.einsum
) -> jax.Array:
    """``(q_i + v)ᵀ W_R R_{i−j}`` as ``[B, N, Tq, Tk]`` for the causal window, via ``rel_shift``.

    ``r_KNH`` is ``W_R R`` for distances ``Tk − 1 … 0`` (``relative_sinusoid`` projected and split into
    heads); query i sits at window position ``Tk − Tq + i``, keys at ``0 … Tk − 1``. Entries with
    ``j > i + Tk − Tq`` (future keys) are not meaningful and must be masked by the caller. ``einsum``
    does the product (the model passes a mixed-precision one).
    """
    _checks.ndim("position_logits", "q_BQNH", q_BQNH, 4, "[batch, q_len, heads, head_dim]")
    _checks.ndim("position_logits", "r_KNH", r_KNH, 3, "[k_len, heads, head_dim]")
    if r_KNH.shape[0] < q_BQNH.shape[1]:
        _checks.fail(
            "position_logits",
            "r_KNH.shape[0]",
            r_KNH.shape[0],
            f"the window must hold at least the {q_BQNH.shape[1]} queries (k_len = mem + q_len)",
        )
    if v_NH is not None:
        q_BQNH = q_BQNH + v_NH
    return rel_shift(einsum("bqnh,knh->bnqk", q_BQNH, r_KNH))
