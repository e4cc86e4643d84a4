"""Attention over key tiles with an online softmax: the tile contract of the position schemes.

A position scheme says what it adds to one tile of attention, all queries ``I`` against a block of
keys ``J``, given their explicit integer positions, through two callbacks:

* ``logit_term(params, q_BINH, k_BJNH, q_pos_I, k_pos_J)`` -> ``[B, N, I, J]`` float32 (or anything
  broadcastable to it), in final logit units: added to ``scale·q·k``;
* ``value_term(params, p_BNIJ, q_pos_I, k_pos_J)`` -> ``[B, I, N, H]``: added to ``Σ_j p_ij v_j``
  (Shaw's value side). It must be linear in ``p``: the tiled path calls it with the tile's weights
  before normalisation and rescales the running sum, as it does for ``Σ_j p_ij v_j``.

Query i may attend key j iff ``key_valid[j]`` and ``0 ≤ q_pos[i] − k_pos[j]`` (≤ ``max_distance``
when given: Transformer-XL's same_length), or, when ``mask [T, K]`` is given, iff ``key_valid[j]``
and ``mask[i, j]``. Masked logits are ``finfo(float32).min`` and their weights exactly 0.

``key_tile=None``: one tile, plain softmax and plain autodiff, ``[B, N, T, K]`` live (the dense
reference). ``key_tile=J``: keys padded to a multiple of J (padding invalid; its positions continue
``k_pos[-1] + 1, …`` so that a tile's positions stay contiguous), then, FlashAttention-2's way:

  forward   scan over tiles t: s = logits(q, k_t) masked; m' = max(m, max_j s); α = e^(m − m');
            e = e^(s − m'); l = α·l + Σ_j e; acc = α·acc + drop(e)·v_t + value_term(drop(e));
            out = acc / l, lse = m + log l. Saved: q, k, v, params, out, lse (no [T, K]).
  backward  D = Σ_h dO·out per row (out includes the value term, so Σ_j p_ij dO·(v_j + a_ij) = D);
            scan over tiles again: s and its VJP by ``jax.vjp`` of the tile's logits (the callbacks'
            own gradients to q, k_t and params come for free), p = e^(s − lse), dP̃ and dv_t, dparams
            by ``jax.vjp`` of the tile's output, dp = drop(dP̃), ds = p·(dp − D); dq and dparams
            are summed over tiles, dk_t and dv_t emitted per tile. Only [B, N, T, J] is live.

Dropout (``dropatt > 0``, ``dropout_key`` required) acts on the normalised weights: tile t keeps
``keep_mask(fold_in(dropout_key, t), (B, N, T, J), dropatt)`` of ``relpos_jax.ops.dropout`` (kept
weights scaled by ≈1/(1 − rate)), where J = min(key_tile, K) and tile t holds keys ``[tJ, tJ + J)``
of the padded window; the backward draws the same masks. The dense path draws tile 0 with J = K,
so ``key_tile=None`` and any ``key_tile ≥ K`` drop the same weights.

Legend: B batch, T queries, K keys (memory + segment), I/J query/key tile sizes (I = T here), N heads,
H head dim.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from relpos_jax.ops.dropout import keep_mask

F32 = jnp.float32
NEG = float(jnp.finfo(F32).min)  # a masked logit: exp(NEG − m) is 0, NEG − NEG is 0, never NaN


class _Config(NamedTuple):
    """The static part of one call (hashed by ``custom_vjp``'s ``nondiff_argnums``)."""

    scale: float
    logit_term: Callable | None
    value_term: Callable | None
    max_distance: int | None
    tile: int
    num_tiles: int
    rate: float


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
    max_distance: int | None = None,
    mask: jax.Array | None = None,
    key_tile: int | None = None,
    dropatt: float = 0.0,
    dropout_key: jax.Array | None = None,
) -> jax.Array:
    """Attention output ``[B, T, N, H]`` in q's dtype (see the module docstring for the contract).

    Gradients flow to q, k, v and every (floating) leaf of ``params``; positions, validity, mask
    and key get none."""
    q_len, k_len = q_BTNH.shape[1], k_BKNH.shape[1]
    if not 0.0 <= dropatt < 1.0:
        raise ValueError(f"attend: dropatt={dropatt} must be in [0, 1)")
    if dropatt > 0.0 and dropout_key is None:
        raise ValueError("attend: dropatt > 0 needs a dropout_key")
    if key_tile is not None and key_tile < 1:
        raise ValueError(f"attend: key_tile={key_tile} must be a positive number of keys")
    if mask is not None and mask.shape != (q_len, k_len):
        raise ValueError(f"attend: mask has shape {mask.shape}, expected {(q_len, k_len)}")
    rate = float(dropatt) if dropout_key is not None else 0.0
    q_pos, k_pos = jnp.asarray(q_pos, jnp.int32), jnp.asarray(k_pos, jnp.int32)
    key_valid = jnp.asarray(key_valid, bool)
    tile = k_len if key_tile is None else min(key_tile, k_len)
    num_tiles = -(-k_len // tile)
    cfg = _Config(float(scale), logit_term, value_term, max_distance, tile, num_tiles, rate)
    if key_tile is None:
        return _dense(
            cfg, q_BTNH, k_BKNH, v_BKNH, params, q_pos, k_pos, key_valid, mask, dropout_key
        )
    pad = num_tiles * tile - k_len
    if pad:
        k_BKNH, v_BKNH = (jnp.pad(x, ((0, 0), (0, pad), (0, 0), (0, 0))) for x in (k_BKNH, v_BKNH))
        k_pos = jnp.concatenate([k_pos, k_pos[-1] + 1 + jnp.arange(pad, dtype=jnp.int32)])
        key_valid = jnp.pad(key_valid, (0, pad))
        mask = None if mask is None else jnp.pad(mask, ((0, 0), (0, pad)))
    return _tiled(cfg, q_BTNH, k_BKNH, v_BKNH, params, q_pos, k_pos, key_valid, mask, dropout_key)


# ----------------------------------------------------------------------------------- one tile


def _allowed(cfg: _Config, q_pos, k_pos_J, valid_J, mask_IJ) -> jax.Array:
    """``[I, J]`` bool: may query i attend key j."""
    if mask_IJ is None:
        rel = q_pos[:, None] - k_pos_J[None, :]
        mask_IJ = rel >= 0
        if cfg.max_distance is not None:
            mask_IJ = mask_IJ & (rel <= cfg.max_distance)
    return mask_IJ & valid_J[None, :]


def _logits(cfg: _Config, q, k_J, params, q_pos, k_pos_J) -> jax.Array:
    """``[B, N, I, J]`` float32 logits of the tile, before the mask."""
    s = cfg.scale * jnp.einsum("binh,bjnh->bnij", q, k_J, preferred_element_type=F32)
    if cfg.logit_term is not None:
        s = s + cfg.logit_term(params, q, k_J, q_pos, k_pos_J).astype(F32)
    return s


def _values(cfg: _Config, p, v_J, params, q_pos, k_pos_J) -> jax.Array:
    """``Σ_j p_ij v_j + value_term(p)`` -> ``[B, I, N, H]`` float32."""
    out = jnp.einsum("bnij,bjnh->binh", p, v_J.astype(F32), preferred_element_type=F32)
    if cfg.value_term is not None:
        out = out + cfg.value_term(params, p, q_pos, k_pos_J).astype(F32)
    return out


def _keep(cfg: _Config, key, t, shape) -> jax.Array | None:
    """Tile t's dropout factors (0 or the kept scale) ``[B, N, I, J]``, or None without dropout."""
    if cfg.rate == 0.0:
        return None
    keep, factor = keep_mask(jax.random.fold_in(key, t), shape, cfg.rate)
    return jnp.where(keep, jnp.asarray(factor, F32), jnp.zeros((), F32))


def _dense(cfg: _Config, q, k, v, params, q_pos, k_pos, valid, mask, key) -> jax.Array:
    """The reference: one tile, the plain softmax, plain autodiff."""
    s = _logits(cfg, q, k, params, q_pos, k_pos)
    allowed = _allowed(cfg, q_pos, k_pos, valid, mask)
    p = jax.nn.softmax(jnp.where(allowed, s, NEG), axis=-1)
    keep = _keep(cfg, key, 0, p.shape)
    p = p if keep is None else p * keep
    return _values(cfg, p, v, params, q_pos, k_pos).astype(q.dtype)


# ------------------------------------------------------------------------------- key tiles


def _tile_inputs(cfg: _Config, t, k, v, k_pos, valid, mask):
    """Tile t's keys, values, key positions, validity and mask columns (padded window)."""
    start = t * cfg.tile
    cut = lambda x, axis: jax.lax.dynamic_slice_in_dim(x, start, cfg.tile, axis)  # noqa: E731
    mask_J = None if mask is None else cut(mask, 1)
    return cut(k, 1), cut(v, 1), cut(k_pos, 0), cut(valid, 0), mask_J


def _forward(cfg: _Config, q, k, v, params, q_pos, k_pos, valid, mask, key):
    """The online softmax over key tiles: ``(out [B, T, N, H] in q's dtype, lse [B, N, T])``."""
    batch, q_len, heads, head_dim = q.shape

    def step(carry, t):
        m, l, acc = carry
        k_J, v_J, k_pos_J, valid_J, mask_J = _tile_inputs(cfg, t, k, v, k_pos, valid, mask)
        allowed = _allowed(cfg, q_pos, k_pos_J, valid_J, mask_J)
        s = jnp.where(allowed, _logits(cfg, q, k_J, params, q_pos, k_pos_J), NEG)
        m_new = jnp.maximum(m, s.max(axis=-1))
        alpha = jnp.exp(m - m_new)
        e = jnp.where(allowed, jnp.exp(s - m_new[..., None]), 0.0)
        l = alpha * l + e.sum(axis=-1)
        keep = _keep(cfg, key, t, e.shape)
        e = e if keep is None else e * keep
        acc = acc * _rows_to_output(alpha) + _values(cfg, e, v_J, params, q_pos, k_pos_J)
        return (m_new, l, acc), None

    init = (
        jnp.full((batch, heads, q_len), NEG, F32),
        jnp.zeros((batch, heads, q_len), F32),
        jnp.zeros((batch, q_len, heads, head_dim), F32),
    )
    (m, l, acc), _ = jax.lax.scan(step, init, jnp.arange(cfg.num_tiles))
    some = l > 0  # every real query row has an allowed key; guard the others against 0/0
    l_safe = jnp.where(some, l, 1.0)
    out = acc / _rows_to_output(l_safe)
    lse = jnp.where(some, m + jnp.log(l_safe), 0.0)
    return out.astype(q.dtype), lse


def _rows_to_output(x_BNT: jax.Array) -> jax.Array:
    """A per-row ``[B, N, T]`` as ``[B, T, N, 1]`` (broadcasts against the output)."""
    return jnp.transpose(x_BNT, (0, 2, 1))[..., None]


def _tiled_fwd(cfg: _Config, q, k, v, params, q_pos, k_pos, valid, mask, key):
    out, lse = _forward(cfg, q, k, v, params, q_pos, k_pos, valid, mask, key)
    return out, (q, k, v, params, q_pos, k_pos, valid, mask, key, out, lse)


def _tiled_bwd(cfg: _Config, residuals, d_out):
    q, k, v, params, q_pos, k_pos, valid, mask, key, out, lse = residuals
    d_out = d_out.astype(F32)
    d_rows = jnp.einsum("binh,binh->bni", d_out, out.astype(F32))  # D_i = dO_i · O_i
    to_f32 = lambda tree: jax.tree.map(lambda x: x.astype(F32), tree)  # noqa: E731

    def step(carry, t):
        dq, dparams = carry
        k_J, v_J, k_pos_J, valid_J, mask_J = _tile_inputs(cfg, t, k, v, k_pos, valid, mask)
        allowed = _allowed(cfg, q_pos, k_pos_J, valid_J, mask_J)
        s, logits_vjp = jax.vjp(
            lambda q_, k_, prm: _logits(cfg, q_, k_, prm, q_pos, k_pos_J), q, k_J, params
        )
        p = jnp.where(allowed, jnp.exp(s - lse[..., None]), 0.0)
        keep = _keep(cfg, key, t, p.shape)
        p_dropped = p if keep is None else p * keep
        _, values_vjp = jax.vjp(
            lambda p_, v_, prm: _values(cfg, p_, v_, prm, q_pos, k_pos_J), p_dropped, v_J, params
        )
        dp, dv_J, dparams_v = values_vjp(d_out)
        dp = dp if keep is None else dp * keep
        ds = p * (dp - d_rows[..., None])
        dq_t, dk_J, dparams_s = logits_vjp(ds)
        dq = dq + dq_t.astype(F32)
        dparams = jax.tree.map(
            lambda a, b, c: a + b + c, dparams, to_f32(dparams_s), to_f32(dparams_v)
        )
        return (dq, dparams), (dk_J, dv_J)

    init = (jnp.zeros(q.shape, F32), jax.tree.map(lambda x: jnp.zeros(x.shape, F32), params))
    (dq, dparams), (dk, dv) = jax.lax.scan(step, init, jnp.arange(cfg.num_tiles))
    dk, dv = (_untile(x, k.shape) for x in (dk, dv))
    dparams = jax.tree.map(lambda g, x: g.astype(x.dtype), dparams, params)
    return dq.astype(q.dtype), dk, dv, dparams, None, None, None, None, None


def _untile(x_tBJNH: jax.Array, shape) -> jax.Array:
    """Per-tile ``[num_tiles, B, J, N, H]`` -> ``[B, K, N, H]``."""
    return jnp.moveaxis(x_tBJNH, 0, 1).reshape(shape)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _tiled(cfg: _Config, q, k, v, params, q_pos, k_pos, valid, mask, key) -> jax.Array:
    return _forward(cfg, q, k, v, params, q_pos, k_pos, valid, mask, key)[0]


_tiled.defvjp(_tiled_fwd, _tiled_bwd)
