"""Attention over tiles with an online softmax: the tile contract of the position schemes.

A position scheme says what it adds to one tile of attention, a block of queries ``I`` against a
block of keys ``J``, given their explicit integer positions, through three callbacks (the pieces
of one tile are in ``attention.tile``):

* ``logit_term(params, q_BINH, k_BJNH, q_pos_I, k_pos_J)`` -> ``[B, N, I, J]`` float32 (or anything
  broadcastable to it), in final logit units: added to ``scale·q·k``;
* ``value_term(params, p_BNIJ, q_pos_I, k_pos_J)`` -> ``[B, I, N, H]``: added to ``Σ_j p_ij v_j``
  (Shaw's value side). It must be linear in ``p``: the tiled path calls it with the tile's weights
  before normalisation and rescales the running sum, as it does for ``Σ_j p_ij v_j``;
* ``band`` (``attention.band.Band``): a logit term ``a_i · w_{q_pos_i − k_pos_j}`` given by its
  query side and its rows per distance (Transformer-XL's ``(q + v)·W_R·R``), which the key scan
  scores once per distance, carrying each key tile's products to the next.

Query i may attend key j iff ``key_valid[j]`` and ``0 ≤ q_pos[i] − k_pos[j]`` (≤ ``max_distance``
when given: Transformer-XL's same_length), or, when ``mask [T, K]`` is given, iff ``key_valid[j]``
and ``mask[i, j]``. Masked logits are ``finfo(float32).min`` and their weights exactly 0.

``key_tile=None``: one tile, plain softmax and plain autodiff, ``[B, N, T, K]`` live (the dense
reference). ``key_tile=J``: keys padded to a multiple of J and queries to a multiple of
I = ``query_tile`` (default T: one query tile); padding keys are invalid, padding queries are
dropped from the output, and padded positions continue ``pos[-1] + 1, …`` so that a tile's
positions stay contiguous. Then, FlashAttention-2's way, for each query tile:

  forward   scan over key tiles t: s = logits(q, k_t) masked; m' = max(m, max_j s); α = e^(m − m');
            e = e^(s − m'); l = α·l + Σ_j e; acc = α·acc + drop(e)·v_t + value_term(drop(e));
            out = acc / l, lse = m + log l. Saved: q, k, v, params, out, lse (no [T, K]).
  backward  D = Σ_h dO·out per row (out includes the value term, so Σ_j p_ij dO·(v_j + a_ij) = D);
            scan over key tiles again: s and its VJP by ``jax.vjp`` of the tile's logits (the
            callbacks' own gradients to q, k_t and params come for free), p = e^(s − lse), dP̃ and
            dv_t, dparams by ``jax.vjp`` of the tile's output, dp = drop(dP̃), ds = p·(dp − D); dq
            is summed over key tiles, dk, dv and dparams over all tiles.

A tile where no query may attend any key (keys in the future of every query, beyond same_length's
reach, or all invalid) is skipped, forward and backward: ``tile.may_attend`` tells from the
positions and validity, without the tile's ``[I, J]`` mask. The forward scan takes ``UNROLL`` key
tiles an iteration. Only ``[B, N, I, J]`` is ever live, so the memory of a layer grows linearly with
T and K. ``attention.context`` feeds the keys block by block around a ring of devices through
``plan``, ``forward`` (a row with no allowed key: out 0, lse ``NEG``, so blocks merge by lse) and
``gradients`` (a block's share, given the whole softmax's).

Dropout (``dropatt > 0``, ``dropout_key`` required) acts on the normalised weights: tile (i, t)
(query tile i, key tile t) keeps ``keep_mask(fold_in(dropout_key, i·n_t + t), (B, N, I, J),
dropatt)`` of ``relpos_jax.ops.dropout`` (kept weights scaled by ≈1/(1 − rate)), with ``n_t`` key
tiles of J = min(key_tile, K) keys; the backward draws the same masks. The dense path draws tile 0
with I = T and J = K, so ``key_tile=None`` and any ``key_tile ≥ K`` with one query tile drop the
same weights.

Legend: B batch, T queries, K keys (memory + segment), I/J query/key tile sizes, N heads, H head dim.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp

from relpos_jax.attention import band as band_term
from relpos_jax.attention import tile
from relpos_jax.attention.tile import F32, NEG, TileConfig, rows_to_output, vary

UNROLL = 2  # key tiles per iteration of the forward scan (XLA then fuses across a pair of tiles)


def attend(
    q_BTNH: jax.Array,
    k_BKNH: jax.Array,
    v_BKNH: jax.Array,
    *,
    q_pos: jax.Array,
    k_pos: jax.Array,
    key_valid: jax.Array,
    scale: float,
    params: Any = None,
    logit_term: Callable | None = None,
    value_term: Callable | None = None,
    band: band_term.Band | None = None,
    max_distance: int | None = None,
    mask: jax.Array | None = None,
    key_tile: int | None = None,
    query_tile: int | None = None,
    dropatt: float = 0.0,
    dropout_key: jax.Array | None = None,
) -> jax.Array:
    """Attention output ``[B, T, N, H]`` in q's dtype (see the module docstring for the contract).

    Gradients flow to q, k, v and every (floating) leaf of ``params``; positions, validity, mask
    and key get none."""
    cfg, padded = plan(
        q_BTNH, k_BKNH, v_BKNH, params, q_pos, k_pos, key_valid, mask, dropout_key, scale=scale,
        logit_term=logit_term, value_term=value_term, band=band, max_distance=max_distance,
        key_tile=key_tile, query_tile=query_tile, dropatt=dropatt,
    )  # fmt: skip
    if key_tile is None:
        return _dense(cfg, *padded)
    return _tiled(cfg, *padded)[:, : q_BTNH.shape[1]]


def plan(
    q_BTNH, k_BKNH, v_BKNH, params, q_pos, k_pos, key_valid, mask, dropout_key, *, scale,
    logit_term, value_term, max_distance, key_tile, query_tile, dropatt, band=None,
) -> tuple[TileConfig, tuple]:  # fmt: skip
    """``attend``'s checks, static config and inputs ``(q, k, v, params, q_pos, k_pos, key_valid,
    mask, key)`` padded to whole tiles (as given with ``key_tile=None``), typed alike (``vary``)."""
    q_len, k_len = q_BTNH.shape[1], k_BKNH.shape[1]
    if not 0.0 <= dropatt < 1.0:
        raise ValueError(f"attend: dropatt={dropatt} must be in [0, 1)")
    if dropatt > 0.0 and dropout_key is None:
        raise ValueError("attend: dropatt > 0 needs a dropout_key")
    for name, size in (("key_tile", key_tile), ("query_tile", query_tile)):
        if size is not None and size < 1:
            raise ValueError(f"attend: {name}={size} must be a positive number of positions")
    if mask is not None and mask.shape != (q_len, k_len):
        raise ValueError(f"attend: mask has shape {mask.shape}, expected {(q_len, k_len)}")
    rate = float(dropatt) if dropout_key is not None else 0.0
    q_pos, k_pos = jnp.asarray(q_pos, jnp.int32), jnp.asarray(k_pos, jnp.int32)
    key_valid = jnp.asarray(key_valid, bool)
    keys = k_len if key_tile is None else min(key_tile, k_len)
    rows = q_len if query_tile is None or key_tile is None else min(query_tile, q_len)
    num_tiles, num_rows = -(-k_len // keys), -(-q_len // rows)
    inputs = (q_BTNH, k_BKNH, v_BKNH, params, q_pos, k_pos, key_valid, mask, dropout_key)
    varying = tuple(sorted(set().union(*(tile.varying_axes(x) for x in jax.tree.leaves(inputs)))))
    cfg = TileConfig(
        float(scale), logit_term, value_term, max_distance, rows, num_rows, keys, num_tiles, rate,
        varying, band,
    )  # fmt: skip
    inputs = vary(cfg, inputs)  # one type for every input and carry; shared gradients summed
    if key_tile is None:
        return cfg, inputs
    q_BTNH, k_BKNH, v_BKNH, params, q_pos, k_pos, key_valid, mask, dropout_key = inputs
    k_BKNH, v_BKNH, k_pos = (_pad(x, num_tiles * keys) for x in (k_BKNH, v_BKNH, k_pos))
    q_BTNH, q_pos = (_pad(x, num_rows * rows) for x in (q_BTNH, q_pos))
    key_valid = jnp.pad(key_valid, (0, num_tiles * keys - k_len))
    if mask is not None:
        mask = jnp.pad(mask, ((0, num_rows * rows - q_len), (0, num_tiles * keys - k_len)))
    return cfg, (q_BTNH, k_BKNH, v_BKNH, params, q_pos, k_pos, key_valid, mask, dropout_key)


def _pad(x: jax.Array, length: int) -> jax.Array:
    """Positions ``[L]`` continued by ``x[-1] + 1, …``, or ``[B, L, …]`` zero-padded, to ``length``."""
    pad = length - (x.shape[0] if x.ndim == 1 else x.shape[1])
    if not pad:
        return x
    if x.ndim == 1:
        return jnp.concatenate([x, x[-1] + 1 + jnp.arange(pad, dtype=x.dtype)])
    return jnp.pad(x, ((0, 0), (0, pad)) + ((0, 0),) * (x.ndim - 2))


def _dense(cfg: TileConfig, q, k, v, params, q_pos, k_pos, valid, mask, key) -> jax.Array:
    """The reference: one tile, the plain softmax, plain autodiff."""
    s = tile.logits(cfg, q, k, params, q_pos, k_pos)
    if cfg.band is not None:
        s = s + band_term.whole(cfg.band, params, q, q_pos[0] - k_pos[0], k.shape[1])
    allowed = tile.allowed_in(cfg, q_pos, k_pos, valid, mask)
    p = jax.nn.softmax(jnp.where(allowed, s, NEG), axis=-1)
    keep = tile.keep(cfg, key, 0, p.shape)
    p = p if keep is None else p * keep
    return tile.values(cfg, p, v, params, q_pos, k_pos).astype(q.dtype)


def _forward_rows(cfg: TileConfig, i, q_I, q_pos_I, mask_I, k, v, params, k_pos, valid, key):
    """The online softmax of query tile i over the key tiles: ``(out [B, I, N, H] float32,
    lse [B, N, I])``."""
    batch, rows, heads, head_dim = q_I.shape
    a = None if cfg.band is None else cfg.band.query(params, q_I)

    def step(carry, t):
        k_J, v_J, k_pos_J, valid_J, mask_IJ = tile.key_tile(cfg, t, k, v, k_pos, valid, mask_I)
        allowed = tile.allowed_in(cfg, q_pos_I, k_pos_J, valid_J, mask_IJ)

        def visit(carry):
            m, l, acc, band = carry
            s = tile.logits(cfg, q_I, k_J, params, q_pos_I, k_pos_J)
            if a is not None:
                delta = q_pos_I[0] - k_pos_J[0]
                p_t, before, band = band_term.tile(cfg.band, params, a, delta, allowed, band)
                s = s + band_term.logits(p_t, before, cfg.tile)
            s = jnp.where(allowed, s, NEG)
            m_new = jnp.maximum(m, s.max(axis=-1))
            alpha = jnp.exp(m - m_new)
            # a row with no allowed key yet subtracts 0: its masked logits then give e^NEG = 0
            e = jnp.exp(s - jnp.where(m_new == NEG, 0.0, m_new)[..., None])
            l = alpha * l + e.sum(axis=-1)
            keep = tile.keep(cfg, key, i * cfg.num_tiles + t, e.shape)
            e = e if keep is None else e * keep
            acc = acc * rows_to_output(alpha) + tile.values(cfg, e, v_J, params, q_pos_I, k_pos_J)
            return m_new, l, acc, band

        def skip(carry):
            return (*carry[:3], None if a is None else band_term.skipped(carry[3]))

        visited = tile.may_attend(cfg, q_pos_I, k_pos_J, valid_J, mask_IJ, allowed)
        return jax.lax.cond(visited, visit, skip, carry), None

    init = (
        jnp.full((batch, heads, rows), NEG, F32),
        jnp.zeros((batch, heads, rows), F32),
        jnp.zeros((batch, rows, heads, head_dim), F32),
        None if a is None else band_term.initial(a, cfg.tile, backward=False),
    )
    (m, l, acc, _), _ = jax.lax.scan(
        step, vary(cfg, init), jnp.arange(cfg.num_tiles), unroll=UNROLL
    )
    some = l > 0  # a row without an allowed key: out 0, lse NEG (a block of ``context``'s ring)
    l_safe = jnp.where(some, l, 1.0)
    return acc / rows_to_output(l_safe), jnp.where(some, m + jnp.log(l_safe), NEG)


def forward(cfg: TileConfig, q, k, v, params, q_pos, k_pos, valid, mask, key):
    """Every query tile over every key tile of padded inputs (``plan``): ``(out [B, T, N, H]
    float32, lse [B, N, T])``; a row that may attend no key has out 0 and lse ``NEG``."""
    batch, q_len, heads, _ = q.shape

    def rows(i):
        q_I, q_pos_I, mask_I = tile.query_tile(cfg, i, q, q_pos, mask)
        return _forward_rows(cfg, i, q_I, q_pos_I, mask_I, k, v, params, k_pos, valid, key)

    out, lse = jax.lax.map(rows, jnp.arange(cfg.num_query_tiles))  # [n_i, B, I, …]
    out = jnp.moveaxis(out, 0, 1).reshape(q.shape)
    lse = jnp.moveaxis(lse, 0, 2).reshape(batch, heads, q_len)
    return out, lse


def _backward_rows(cfg: TileConfig, i, q_I, q_pos_I, mask_I, lse_I, d_out_I, d_rows_I, residuals):
    """Query tile i's share of the gradients: ``dq_I`` and, per key tile, ``dk_J, dv_J`` (all
    float32), and ``dparams`` summed over its key tiles."""
    k, v, params, k_pos, valid, key = residuals
    to_f32 = lambda tree: jax.tree.map(lambda x: x.astype(F32), tree)  # noqa: E731
    a, query_vjp = (None, None) if cfg.band is None else jax.vjp(cfg.band.query, params, q_I)

    def step(carry, t):
        k_J, v_J, k_pos_J, valid_J, mask_IJ = tile.key_tile(cfg, t, k, v, k_pos, valid, mask_I)
        allowed = tile.allowed_in(cfg, q_pos_I, k_pos_J, valid_J, mask_IJ)
        delta = q_pos_I[0] - k_pos_J[0]

        def visit(carry):
            dq, dparams, band = carry
            products = ()
            if a is not None:  # the band's products enter as inputs: their cotangents summed
                p_t, before, band_next = band_term.tile(cfg.band, params, a, delta, allowed, band)
                products = (p_t, before)

            def logits(q_, k_, prm, *products):
                s = tile.logits(cfg, q_, k_, prm, q_pos_I, k_pos_J)
                return s + band_term.logits(*products, cfg.tile) if products else s

            s, logits_vjp = jax.vjp(logits, q_I, k_J, params, *products)
            p = jnp.where(allowed, jnp.exp(s - lse_I[..., None]), 0.0)
            keep = tile.keep(cfg, key, i * cfg.num_tiles + t, p.shape)
            p_dropped = p if keep is None else p * keep
            _, values_vjp = jax.vjp(
                lambda p_, v_, prm: tile.values(cfg, p_, v_, prm, q_pos_I, k_pos_J),
                p_dropped, v_J, params,
            )  # fmt: skip
            dp, dv_J, dparams_v = values_vjp(d_out_I)
            dp = dp if keep is None else dp * keep
            ds = p * (dp - d_rows_I[..., None])
            dq_t, dk_J, dparams_s, *d_products = logits_vjp(ds)
            if a is not None:
                band = band_term.backward(
                    cfg.band, params, a, delta, allowed, band_next, *d_products
                )
            dparams = jax.tree.map(
                lambda x, y, z: x + y + z, dparams, to_f32(dparams_s), to_f32(dparams_v)
            )
            dk_dv = (dk_J.astype(F32), dv_J.astype(F32))
            return (dq + dq_t.astype(F32), dparams, band), dk_dv

        def skip(carry):
            zeros = vary(cfg, jnp.zeros(k_J.shape, F32))
            if a is not None:
                carry = (*carry[:2], band_term.flush(cfg.band, params, a, cfg.tile, carry[2]))
            return carry, (zeros, zeros)

        visited = tile.may_attend(cfg, q_pos_I, k_pos_J, valid_J, mask_IJ, allowed)
        return jax.lax.cond(visited, visit, skip, carry)

    init = (
        jnp.zeros(q_I.shape, F32),
        jax.tree.map(lambda x: jnp.zeros(x.shape, F32), params),
        None
        if a is None
        else band_term.initial(
            a, cfg.tile, backward=True, delta=q_pos_I[0] - k_pos[0], window=k.shape[1]
        ),
    )
    init = vary(cfg, init)
    (dq_I, dparams, band), (dk, dv) = jax.lax.scan(step, init, jnp.arange(cfg.num_tiles))
    if a is not None:  # the last pending products, then the band's query
        band = band_term.flush(cfg.band, params, a, cfg.tile, band)
        dparams_a, dq_a = query_vjp(band.da.astype(a.dtype))
        dq_I = dq_I + dq_a.astype(F32)
        d_rows = band_term.parameter_gradients(cfg.band, params, band)
        dparams = jax.tree.map(lambda x, y, z: x + y + z, dparams, d_rows, to_f32(dparams_a))
    return dq_I, _untile(dk, k.shape), _untile(dv, v.shape), dparams


def _untile(x_tBJNH: jax.Array, shape) -> jax.Array:
    """Per-tile ``[n_tiles, B, J, N, H]`` -> ``[B, n_tiles·J, N, H]``."""
    return jnp.moveaxis(x_tBJNH, 0, 1).reshape(shape)


def _tiled_fwd(cfg: TileConfig, q, k, v, params, q_pos, k_pos, valid, mask, key):
    out, lse = forward(cfg, q, k, v, params, q_pos, k_pos, valid, mask, key)
    out = out.astype(q.dtype)
    return out, (q, k, v, params, q_pos, k_pos, valid, mask, key, out, lse)


def _tiled_bwd(cfg: TileConfig, residuals, d_out):  # residuals: q, k, v, params, …
    return as_inputs(gradients(cfg, residuals, d_out), *residuals[:4])


def as_inputs(grads, q, k, v, params) -> tuple:
    """float32 ``(dq, dk, dv, dparams)`` in their inputs' dtypes, and None for the other five."""
    dq, dk, dv, dparams = grads
    dparams = jax.tree.map(lambda g, x: g.astype(x.dtype), dparams, params)
    return (dq.astype(q.dtype), dk.astype(k.dtype), dv.astype(v.dtype), dparams, *(None,) * 5)


def gradients(cfg: TileConfig, residuals, d_out):
    """float32 ``(dq, dk, dv, dparams)`` of padded inputs from the residuals ``(q, k, v, params,
    q_pos, k_pos, valid, mask, key, out, lse)``, where ``out`` and ``lse`` are those of the whole
    softmax: so keys may come block by block (``context``'s ring), each block's share exact."""
    q, k, v, params, q_pos, k_pos, valid, mask, key, out, lse = residuals
    d_out = d_out.astype(F32)
    d_rows = jnp.einsum("binh,binh->bni", d_out, out.astype(F32))  # D_i = dO_i · O_i
    shared = (k, v, params, k_pos, valid, key)

    def rows(carry, i):
        dk, dv, dparams = carry
        q_I, q_pos_I, mask_I = tile.query_tile(cfg, i, q, q_pos, mask)
        lse_I, d_rows_I = (tile.cut(x, i, cfg.query_tile, 2) for x in (lse, d_rows))
        d_out_I = tile.cut(d_out, i, cfg.query_tile, 1)
        dq_I, dk_i, dv_i, dparams_i = _backward_rows(
            cfg, i, q_I, q_pos_I, mask_I, lse_I, d_out_I, d_rows_I, shared
        )
        dparams = jax.tree.map(jnp.add, dparams, dparams_i)
        return (dk + dk_i, dv + dv_i, dparams), dq_I

    zeros = lambda x: jnp.zeros(x.shape, F32)  # noqa: E731
    init = (zeros(k), zeros(v), jax.tree.map(zeros, params))
    (dk, dv, dparams), dq = jax.lax.scan(rows, vary(cfg, init), jnp.arange(cfg.num_query_tiles))
    return _untile(dq, q.shape), dk, dv, dparams


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _tiled(cfg: TileConfig, q, k, v, params, q_pos, k_pos, valid, mask, key) -> jax.Array:
    return forward(cfg, q, k, v, params, q_pos, k_pos, valid, mask, key)[0].astype(q.dtype)


_tiled.defvjp(_tiled_fwd, _tiled_bwd)
