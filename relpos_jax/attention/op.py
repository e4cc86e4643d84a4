"""The attention op: which implementation attends a layer's projected queries, keys and values
(``model.attention_impl``, decided per call by ``fused.path``).

* ``dense``: the ``[B, N, T, K]`` logits at once, from the layer's hooks (``Attention.logits``):
  one tile covering every key, the reference, and the fastest at short lengths;
* ``tiled``: key tiles with an online softmax (``attention.tiled``), the scheme's hooks as tile
  callbacks (``tile_hooks``): nothing of size T·K live, forward or backward; with the segment split
  over the mesh's ``context`` axis, ring attention (``attention.context``);
* ``kernel``: the Pallas kernels (``attention.fused``), the scheme's terms as tables by distance.

Each returns the heads' outputs ``[B, T, N, H]``; the layer projects them back.

Legend: B batch, T queries, K = M + T keys, N heads, H head dim.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from relpos_jax.attention import context as context_parallel
from relpos_jax.attention import fused, tiled
from relpos_jax.attention.position_context import PositionContext
from relpos_jax.attention.tile_hooks import tiled_hooks
from relpos_jax.ops import precision


def attend(layer: Any, q, k, v, ctx: PositionContext, deterministic: bool) -> jax.Array:
    """``[B, T, N, H]``: the queries ``q [B, T, N, H]`` of ``layer`` (an ``Attention``) against its
    keys and values (laid out as ``layer.kv_layout``) by the path this call takes."""
    split = context_parallel.splits(q.shape[1], k.shape[1])
    keys = k.shape[-1 if layer.kv_layout == "bnhk" else 1]
    impl = fused.path(layer.config, q.shape[1], keys, ctx.mask, split)
    if impl == "kernel":
        return _kernel(layer, q, k, v, ctx, deterministic)
    if impl == "tiled":
        return _tiled(layer, q, k, v, ctx, deterministic)
    return _dense(layer, q, k, v, ctx, deterministic)


def _dense(layer: Any, q, k, v, ctx: PositionContext, deterministic: bool) -> jax.Array:
    context = layer.context(ctx, q.dtype)  # once: the logits and the value side
    weights = layer.softmax(q, k, ctx, context)
    weights = layer.dropatt(weights, deterministic=deterministic).astype(q.dtype)
    out = precision.einsum(f"bnqk,{layer.kv_layout}->bqnh", weights, v)
    value_term = layer.scheme.value_term(layer.position, weights, ctx.tile(), context)
    return out if value_term is None else out + value_term


def _keys_by_row(layer: Any, k, v):
    """Keys and values ``[B, K, N, H]``, as the kernels and the tiles cut them."""
    if layer.kv_layout == "bnhk":
        return k.transpose(0, 3, 1, 2), v.transpose(0, 3, 1, 2)
    return k, v


def _dropout(layer: Any, deterministic: bool) -> tuple[float, jax.Array | None]:
    rate = 0.0 if deterministic else layer.dropatt.rate
    return rate, layer.dropatt.next_key() if rate else None


def _kernel(layer: Any, q, k, v, ctx: PositionContext, deterministic: bool) -> jax.Array:
    """``attention.fused``: the Pallas kernels, the scheme's terms as tables by distance."""
    k, v = _keys_by_row(layer, k, v)
    rate, key = _dropout(layer, deterministic)
    return fused.attend(layer, q, k, v, ctx, layer.context(ctx, q.dtype), rate, key)


def _tiled(layer: Any, q, k, v, ctx: PositionContext, deterministic: bool) -> jax.Array:
    """``attention.tiled.attend`` over tiles of ``query_tile`` queries by ``key_tile`` keys: the
    scheme's hooks on each tile (``tile_hooks``), nothing of size T·K live, forward or backward."""
    k, v = _keys_by_row(layer, k, v)
    rate, key = _dropout(layer, deterministic)
    cfg = layer.config
    own, arrays = nnx.split(layer.position)  # the scheme's module travels as its arrays
    params = (nnx.to_pure_dict(arrays), layer.context(ctx, q.dtype))
    logit_term, value_term, band = tiled_hooks(cfg, own, k.shape[1] - q.shape[1])
    valid = ctx.key_valid if ctx.key_valid is not None else jnp.ones(k.shape[1], bool)
    hooks = dict(
        scale=layer.scale, logit_term=logit_term, value_term=value_term, band=band,
        max_distance=layer.max_distance(ctx), dropatt=rate,
    )  # fmt: skip
    split = context_parallel.splits(q.shape[1], k.shape[1])  # the mesh splits the segment
    return (context_parallel.attend if split else tiled.attend)(
        q, k, v, q_pos=ctx.q_pos, k_pos=ctx.k_pos, key_valid=valid, params=params, mask=ctx.mask,
        dropout_key=key, key_tile=cfg.key_tile, query_tile=cfg.query_tile, **hooks,
    )  # fmt: skip
