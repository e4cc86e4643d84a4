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
    """The Transformer-XL shift on the last two axes ``[..., Tq, Tk]``; zero outside the causal part.

    Column c of ``x`` holds relative distance ``Tk − 1 − c``. The result ``y`` has
    ``y[..., i, j] = x[..., i, j + Tq − 1 − i]`` wherever ``j ≤ i + (Tk − Tq)`` (the causal part) and
    0 elsewhere, where the paper's pad-reshape-slice leaves values of neighbouring rows that the
    caller masks anyway.

    The paper pads a zero column and reads the ``[Tq, Tk + 1]`` block as ``[Tk + 1, Tq]``; XLA:CPU
    turns those reshapes into per-element divisions by ``Tk + 1`` wherever it fuses them into a
    neighbouring loop. Here row i of the result is the run of the flattened block that starts at
    ``Tq − 1 + i·(Tk − 1)``: rows of ``Tk − 1`` read at that stride, and a last column that is
    causal only in the last row, where it is ``x[..., Tq − 1, Tk − 1]``. The backward pass (a
    custom VJP, the exact transpose) reads the cotangent at row stride ``Tk + 1``: a pad and a
    reshape. Both divide only by ``Tk`` (a shift for the usual power-of-two windows), and neither
    needs an index table.
    """
    _checks.ndim("rel_shift", "x", x, tuple(range(2, 9)), "[..., Tq, Tk]")
    return _rel_shift(x)


def _causal(q_len: int, k_len: int) -> np.ndarray:
    return np.arange(k_len) <= np.arange(q_len)[:, None] + (k_len - q_len)


def _pad_last(x: jax.Array, before: int, after: int) -> jax.Array:
    return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(before, after)])


@jax.custom_vjp
def _rel_shift(x: jax.Array) -> jax.Array:
    *lead, q_len, k_len = x.shape
    flat = x.reshape(*lead, q_len * k_len)
    start = q_len - 1
    body = flat[..., start : start + q_len * (k_len - 1)].reshape(*lead, q_len, k_len - 1)
    last_column = np.arange(k_len) == k_len - 1  # causal only in the last row: x[Tq − 1, Tk − 1]
    shifted = jnp.where(last_column, x[..., k_len - 1 :], _pad_last(body, 0, 1))
    return jnp.where(_causal(q_len, k_len), shifted, jnp.zeros((), x.dtype))


def _rel_shift_forward(x: jax.Array):
    return _rel_shift(x), None


def _rel_shift_backward(_, cotangent: jax.Array):
    """``x[i, c]`` went to ``y[i, c − (Tq − 1 − i)]`` (flat position ``i·(Tk + 1) + c − (Tq − 1)``)
    when that column is ≥ 0; every such entry is causal."""
    *lead, q_len, k_len = cotangent.shape
    flat = cotangent.reshape(*lead, q_len * k_len)
    padded = _pad_last(flat, q_len - 1, 1)
    grad = padded.reshape(*lead, q_len, k_len + 1)[..., :k_len]
    landed = np.arange(k_len) >= (q_len - 1 - np.arange(q_len))[:, None]
    return (jnp.where(landed, grad, jnp.zeros((), cotangent.dtype)),)


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
