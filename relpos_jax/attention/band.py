"""A Toeplitz logit term over tiles, each distance scored once: Transformer-XL's
``(q_i + v)ᵀ W_R R_{i−j}``.

A band term adds ``a_i · w_d`` to the logit of query i and key j, where ``d = q_pos_i − k_pos_j``:
``a = query(params, q)`` (``[B, I, N, H]``, in final logit units) and ``w`` rows per distance
(``rows(params, top, count)``: ``[count, N, H]`` for distances ``top, top − 1, …``). A tile whose
first query and first key are ``δ`` apart spans ``I + J − 1`` distances, so scoring it alone takes
``I·(I + J − 1)`` products a head: twice its content product when I = J. But within a query tile's
scan over contiguous key tiles the bands overlap, and each distance is scored once:

* tile t computes ``P_t[i, c] = a_i · w_{δ_t − c}`` for ``c ≤ J`` (``[B, N, I, J + 1]``);
* a pair with ``j > i`` reads ``P_t[i, j − i]``; a pair with ``j ≤ i`` reads the previous key
  tile's ``P_{t−1}[i, J − i + j]`` (``δ_{t−1} = δ_t + J``), carried by the scan (computed on the
  spot for the first tile visited after a skipped one);
* both reads are slices of the flat products at row stride ``J`` (no gather, no index table; the
  extra column makes the stride J, a shift for power-of-two tiles);
* products no allowed pair reads are not computed: under the causal rule the diagonal tile's
  ``P_t`` (its pairs ``j > i`` are all in the future), so a query tile over a window of n key
  tiles scores ``n`` blocks of distances, where tiles on their own would score ``2n``.

Backward, a block's cotangent is summed over the two tiles that read it, then its two products are
taken once (``da = dP·w``, ``dw = dPᵀ·a``): one product a visited tile forward, three backward.
``dw`` is summed per distance over the query tile's scan and reaches the parameters through one
vjp of ``rows`` (``parameter_gradients``).
Carrying needs ``I ≤ J + 1`` (a pair's distance then lies in this tile's or the previous tile's
block); with larger query tiles the block a tile reads for ``j ≤ i`` is computed per tile
(``layout``).

Legend: B batch, I/J queries/keys of a tile, N heads, H head dim, c a column of the products.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from relpos_jax.attention.tile import varying_axes
from relpos_jax.ops import precision

F32 = jnp.float32


class Band(NamedTuple):
    """A scheme's band term: ``query(params, q_BINH) -> a_BINH`` and ``rows(params, top, count) ->
    w [count, N, H]`` (distances ``top`` down; rows beyond the scheme's table may be anything:
    they feed only masked pairs, as do rows of negative distance)."""

    query: Callable
    rows: Callable


def layout(rows: int, keys: int) -> tuple[int, int, bool]:
    """``(offset, columns, carried)`` of the products a tile reads for its pairs ``j ≤ i``: they
    start at distance ``δ + offset`` and span ``columns``; carried: they are the previous key
    tile's ``P_{t−1}`` (``I ≤ J + 1``), else computed for each tile."""
    if rows <= keys + 1:
        return keys, keys + 1, True
    return rows, rows + 1, False


def _upper(rows: int, keys: int) -> np.ndarray:
    """``[I, J]``: the pairs ``j > i``, read from the tile's own products."""
    return np.arange(keys)[None, :] > np.arange(rows)[:, None]


def _read(allowed: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Whether an allowed pair reads the tile's own products (``j > i``) and whether one reads
    the previous ones (``j ≤ i``)."""
    upper = _upper(*allowed.shape)
    return (allowed & upper).any(), (allowed & ~upper).any()


def products(band: Band, params: Any, a: jax.Array, top, count: int) -> jax.Array:
    """``P[b, n, i, c] = a_i · w_{top − c}`` for ``c < count``: ``[B, N, I, count]`` float32."""
    w = band.rows(params, top, count).astype(a.dtype)
    return precision.einsum("binh,cnh->bnic", a, w, out_dtype=F32)


def _diagonals(p: jax.Array, start: int, stride: int, keys: int) -> jax.Array:
    """``y[..., i, j] = flat(p)[start + i·stride + j]`` for ``j < keys``: the flat products read at
    row stride ``stride`` (zero-padded where that runs past the end)."""
    *lead, rows, cols = p.shape
    flat = p.reshape(*lead, rows * cols)
    short = start + rows * stride - rows * cols
    if short > 0:
        flat = jnp.pad(flat, [(0, 0)] * len(lead) + [(0, short)])
    body = flat[..., start : start + rows * stride].reshape(*lead, rows, stride)
    return body[..., :keys]


def logits(p: jax.Array, previous: jax.Array, keys: int) -> jax.Array:
    """The tile's ``[B, N, I, J]`` band term from its products ``P_t`` and the previous ones."""
    rows = p.shape[-2]
    offset, columns, _ = layout(rows, keys)
    here = _diagonals(p, 0, keys, keys)  # P_t[i, j − i] (its flat index i·J + j)
    before = _diagonals(previous, offset, columns - 1, keys)  # previous[i, offset − i + j]
    return jnp.where(_upper(rows, keys), here, before)


def finish(band: Band, params, a, d_p, top, count: int) -> tuple[jax.Array, jax.Array]:
    """``(da [B, I, N, H], dw [count, N, H])`` float32 of the products ``P`` (distances ``top``
    down) whose cotangent is ``d_p``: ``da = d_p·w``, ``dw = d_pᵀ·a``."""
    w = band.rows(params, top, count).astype(F32)
    da = precision.einsum("bnic,cnh->binh", d_p, w, out_dtype=F32)
    d_w = precision.einsum("bnic,binh->cnh", d_p, a.astype(F32), out_dtype=F32)
    return da, d_w


class State(NamedTuple):
    """A query tile's band across its scan over key tiles. Forward: the previous key tile's
    products and whether they are there (``ready``). Backward also: the cotangent of those products
    not yet finished (``pending``, of distances from ``top``, ``live``), and the float32 sums
    ``da`` and ``d_rows`` (the cotangent of every row the scan reads, distances ``row_top``
    down)."""

    products: jax.Array
    ready: jax.Array
    pending: jax.Array | None = None
    top: jax.Array | None = None
    live: jax.Array | None = None
    da: jax.Array | None = None
    d_rows: jax.Array | None = None
    row_top: jax.Array | None = None


def _rows_read(rows: int, keys: int, window: int) -> int:
    """How many distances a query tile's scan over ``window`` keys reads, from ``δ_0 + offset``."""
    return layout(rows, keys)[0] + window + 1


def initial(a: jax.Array, keys: int, backward: bool, delta=None, window: int = 0) -> State:
    """The state before the first key tile; backward: ``delta`` is the first tile's ``δ`` and
    ``window`` the (padded) number of keys."""
    batch, rows, heads, head_dim = a.shape
    zeros = jnp.zeros((batch, heads, rows, keys + 1), F32)
    state = State(zeros, jnp.zeros((), bool))
    if not backward:
        return state
    return state._replace(
        pending=zeros, top=jnp.zeros((), jnp.int32), live=jnp.zeros((), bool),
        da=jnp.zeros(a.shape, F32),
        d_rows=jnp.zeros((_rows_read(rows, keys, window), heads, head_dim), F32),
        row_top=delta + layout(rows, keys)[0],
    )  # fmt: skip


def parameter_gradients(band: Band, params, state: State) -> Any:
    """The float32 gradient of the parameters from the rows' cotangent, once per query tile."""
    count = state.d_rows.shape[0]
    rows, rows_vjp = jax.vjp(lambda prm: band.rows(prm, state.row_top, count), params)
    d_rows = state.d_rows.astype(rows.dtype)  # (bfloat16 rows in a bfloat16 model)
    return jax.tree.map(lambda x: x.astype(F32), rows_vjp(d_rows)[0])


def _when(needed, compute: Callable, shape, like: jax.Array) -> jax.Array:
    """``compute()`` if ``needed``, else float32 zeros of ``shape`` typed as ``like`` (inside
    ``jax.shard_map`` both branches vary over the same mesh axes)."""

    def zeros():
        axes = tuple(sorted(varying_axes(like)))
        zeros = jnp.zeros(shape, F32)
        return jax.lax.pcast(zeros, axes, to="varying") if axes else zeros

    return jax.lax.cond(needed, compute, zeros)


def tile(band: Band, params, a, delta, allowed: jax.Array, state: State):
    """A visited tile's products ``P_t`` and the previous products it reads (carried when ready,
    else computed), each computed only where an allowed pair reads it (the diagonal tile's ``P_t``
    is not, under the causal rule: the carried products, or zeros, stand in for its masked pairs),
    and the state for the next tile."""
    (batch, heads), (rows, keys) = (a.shape[0], a.shape[2]), allowed.shape
    offset, columns, carried = layout(rows, keys)
    here, there = _read(allowed)
    p_t = jax.lax.cond(
        here, lambda: products(band, params, a, delta, keys + 1), lambda: state.products
    )
    fresh = lambda: products(band, params, a, delta + offset, columns)  # noqa: E731
    if carried:
        before = jax.lax.cond(state.ready | ~there, lambda: state.products, fresh)
    else:
        before = _when(there, fresh, (batch, heads, rows, columns), a)
    return p_t, before, state._replace(products=p_t, ready=here)


def skipped(state: State) -> State:
    """A skipped tile: the next visited one computes its previous products afresh."""
    return state._replace(ready=state.ready & False)


def _add(band, params, a, state: State, d_p, top, count: int) -> State:
    da, d_w = finish(band, params, a, d_p, top, count)
    start = state.row_top - top
    d_rows = jax.lax.dynamic_update_slice_in_dim(
        state.d_rows, jax.lax.dynamic_slice_in_dim(state.d_rows, start, count) + d_w, start, 0
    )
    return state._replace(da=state.da + da, d_rows=d_rows)


def _add_when(needed, band, params, a, state: State, d_p, top, count: int) -> State:
    add = lambda state: _add(band, params, a, state, d_p, top, count)  # noqa: E731
    return jax.lax.cond(needed, add, lambda state: state, state)


def backward(band: Band, params, a, delta, allowed, state: State, d_p, d_before) -> State:
    """A visited tile's share of the gradients, given the cotangents of ``P_t`` and of the products
    it read for ``j ≤ i``: those of ``P_{t−1}`` are complete now and finished; ``P_t``'s wait for
    the next tile (carried), or are finished now."""
    rows, keys = allowed.shape
    offset, columns, carried = layout(rows, keys)
    here, there = _read(allowed)
    if not carried:
        state = _add_when(here, band, params, a, state, d_p, delta, keys + 1)
        return _add_when(there, band, params, a, state, d_before, delta + offset, columns)
    d_before = d_before + jnp.where(state.live, state.pending, 0.0)
    state = _add_when(there | state.live, band, params, a, state, d_before, delta + offset, columns)
    return state._replace(pending=d_p, top=delta, live=here)


def flush(band: Band, params, a, keys: int, state: State) -> State:
    """After a skipped tile or the last: finish the pending cotangent, if any."""
    if not layout(a.shape[1], keys)[2]:
        return state
    state = _add_when(state.live, band, params, a, state, state.pending, state.top, keys + 1)
    return skipped(state._replace(live=state.live & False))


def whole(band: Band, params, q: jax.Array, delta, keys: int) -> jax.Array:
    """The band term of one tile on its own (the dense reference): ``[B, N, I, J]``."""
    a = band.query(params, q)
    offset, columns, _ = layout(a.shape[1], keys)
    p = products(band, params, a, delta, keys + 1)
    return logits(p, products(band, params, a, delta + offset, columns), keys)
