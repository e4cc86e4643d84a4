"""One tile of attention: a block of queries against a block of keys with their positions, the
pieces the scans of ``attention.tiled`` (and ``attention.context``'s ring) are made of: the static
config of a call, the allowed pairs, a tile's logits and weighted values with the scheme's
callbacks, its dropout factors, and the cuts of the padded window into tiles.

Legend: B batch, I/J query/key tile sizes, N heads, H head dim.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp

from relpos_jax.ops import precision
from relpos_jax.ops.dropout import keep_mask

F32 = jnp.float32
NEG = float(jnp.finfo(F32).min)  # a masked logit: exp(NEG − m) is 0, NEG − NEG is 0, never NaN


class TileConfig(NamedTuple):
    """The static part of one call (hashed by ``custom_vjp``'s ``nondiff_argnums``)."""

    scale: float
    logit_term: Callable | None
    value_term: Callable | None
    max_distance: int | None
    query_tile: int
    num_query_tiles: int
    tile: int  # keys per tile
    num_tiles: int  # key tiles
    rate: float
    varying: tuple[str, ...] = ()  # inside shard_map: the manual axes the inputs vary over
    band: Any = None  # a Toeplitz term: ``attention.band.Band``


def varying_axes(x) -> frozenset:
    """The manual mesh axes ``x`` varies over (none outside ``jax.shard_map``)."""
    return getattr(getattr(jax.typeof(x), "manual_axis_type", None), "varying", frozenset())


def vary(cfg: TileConfig, tree: Any) -> Any:
    """``tree`` typed as varying over ``cfg.varying`` (inside ``jax.shard_map``: ``attention.context``):
    scans and conds need one type for their carries, and ``pcast``'s transpose sums the gradient of
    an input every device shares."""

    def one(x):
        missing = tuple(a for a in cfg.varying if a not in varying_axes(x))
        return jax.lax.pcast(x, missing, to="varying") if missing else x

    return jax.tree.map(one, tree) if cfg.varying else tree


def allowed(q_pos_I, k_pos_J, valid_J=None, *, max_distance=None, mask_IJ=None) -> jax.Array:
    """``[I, J]`` bool: may query i attend key j (the rule of the module docstring; the dense
    path's mask too)."""
    if mask_IJ is None:
        rel = q_pos_I[:, None] - k_pos_J[None, :]
        mask_IJ = rel >= 0
        if max_distance is not None:
            mask_IJ = mask_IJ & (rel <= max_distance)
    return mask_IJ if valid_J is None else mask_IJ & valid_J[None, :]


def allowed_in(cfg: TileConfig, q_pos_I, k_pos_J, valid_J, mask_IJ) -> jax.Array:
    return allowed(q_pos_I, k_pos_J, valid_J, max_distance=cfg.max_distance, mask_IJ=mask_IJ)


def may_attend(cfg: TileConfig, q_pos_I, k_pos_J, valid_J, mask_IJ, allowed_IJ) -> jax.Array:
    """Whether some query of the tile may attend some key (else the tile is skipped): without a
    mask, from the positions in ``O(I + J)`` (exact for contiguous query positions, as the model's
    are; otherwise it may also visit a tile whose pairs are all masked, which adds nothing)."""
    if mask_IJ is not None:
        return allowed_IJ.any()
    reach = valid_J & (k_pos_J <= q_pos_I.max())
    if cfg.max_distance is not None:
        reach = reach & (k_pos_J >= q_pos_I.min() - cfg.max_distance)
    return reach.any()


def logits(cfg: TileConfig, q, k_J, params, q_pos, k_pos_J) -> jax.Array:
    """``[B, N, I, J]`` float32 logits of the tile, before the mask."""
    s = cfg.scale * precision.einsum("binh,bjnh->bnij", q, k_J, out_dtype=F32)
    if cfg.logit_term is not None:
        s = s + cfg.logit_term(params, q, k_J, q_pos, k_pos_J).astype(F32)
    return s


def values(cfg: TileConfig, p, v_J, params, q_pos, k_pos_J) -> jax.Array:
    """``Σ_j p_ij v_j + value_term(p)`` -> ``[B, I, N, H]`` float32."""
    out = precision.einsum("bnij,bjnh->binh", p, v_J.astype(F32), out_dtype=F32)
    if cfg.value_term is not None:
        out = out + cfg.value_term(params, p, q_pos, k_pos_J).astype(F32)
    return out


def keep(cfg: TileConfig, key, index, shape) -> jax.Array | None:
    """Tile ``index``'s dropout factors (0 or the kept scale) ``[B, N, I, J]``, or None without
    dropout."""
    if cfg.rate == 0.0:
        return None
    keep, factor = keep_mask(jax.random.fold_in(key, index), shape, cfg.rate)
    return jnp.where(keep, jnp.asarray(factor, F32), jnp.zeros((), F32))


def cut(x: jax.Array, index, size: int, axis: int) -> jax.Array:
    return jax.lax.dynamic_slice_in_dim(x, index * size, size, axis)


def query_tile(cfg: TileConfig, i, q, q_pos, mask):
    """Query tile i's queries ``[B, I, N, H]``, positions and mask rows (padded window)."""
    mask_I = None if mask is None else cut(mask, i, cfg.query_tile, 0)
    return cut(q, i, cfg.query_tile, 1), cut(q_pos, i, cfg.query_tile, 0), mask_I


def key_tile(cfg: TileConfig, t, k, v, k_pos, valid, mask_I):
    """Key tile t's keys, values, key positions, validity and mask columns (padded window)."""
    mask_IJ = None if mask_I is None else cut(mask_I, t, cfg.tile, 1)
    part = lambda x, axis: cut(x, t, cfg.tile, axis)  # noqa: E731
    return part(k, 1), part(v, 1), part(k_pos, 0), part(valid, 0), mask_IJ


def rows_to_output(x_BNI: jax.Array) -> jax.Array:
    """A per-row ``[B, N, I]`` as ``[B, I, N, 1]`` (broadcasts against the output)."""
    return jnp.transpose(x_BNI, (0, 2, 1))[..., None]
