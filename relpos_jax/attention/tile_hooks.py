"""A scheme's hooks as the tile callbacks of ``attention.tiled.attend`` (and of the ring attention
over the context axis, ``attention.context``): the parameters and context of a layer travel as
arrays through the tiled path's custom gradient, and each callback reads them as the scheme's hooks
read a layer.

Legend: B batch, I/J queries/keys of a tile, N heads, H head dim.
"""

from __future__ import annotations

import functools

import jax.numpy as jnp
import numpy as np
from flax import nnx

from relpos_jax import schemes
from relpos_jax.attention import band as band_term
from relpos_jax.config import ModelConfig
from relpos_jax.schemes import Tile


@functools.cache
def toeplitz_index(rows: int, keys: int) -> np.ndarray:
    """``[I, J]``: where pair (i, j) of a tile, at distance ``δ + i − j``, reads the row of its
    distances ``δ + I − 1`` (the last query against the first key) down to ``δ − J + 1``."""
    return (rows - 1) - np.arange(rows)[:, None] + np.arange(keys)[None, :]


@functools.cache
def tiled_hooks(cfg: ModelConfig, own: nnx.GraphDef, memory: int):
    """The scheme's hooks as the tile callbacks of ``attention.tiled.attend``: ``logit_term`` gives
    a tile's logits beyond ``scale·q·k`` (the content query's shift, the score term, the bias),
    ``value_term`` its value side, ``band`` the score term of a scheme that gives it as a band
    (``band_query``, ``band_rows``: scored once per distance); None where the scheme adds nothing.
    ``params`` is (the arrays of the layer's ``schemes.Parameters``, whose graph is ``own``: each
    callback rebuilds the module with ``nnx.merge``; the layer's context: ``Scheme.layer_context``);
    of a tile's window starts (``Tile.q_start``, ``k_start``) only their difference matters, and
    it follows from the positions (``q_start`` is set as if the tile's first query were the
    segment's first, after ``memory`` slots). Cached per (config, graph, memory): the same callables, so
    ``attend`` compiles once."""
    scheme = schemes.get(cfg.position)
    overrides = {
        hook: schemes.overrides(scheme, hook)
        for hook in ("content_query", "score_term", "bias", "value_term", "band_rows")
    }
    band = overrides.pop("band_rows")  # the score term as a band (``attention.band``)
    overrides["score_term"] &= not band

    def layer(params):
        arrays, context = params
        return nnx.merge(own, arrays), context

    def tile(q_pos_I, k_pos_J) -> Tile:
        return Tile(q_pos_I, k_pos_J, memory, memory + k_pos_J[0] - q_pos_I[0])

    def logit_term(params, q_BINH, k_BJNH, q_pos_I, k_pos_J):
        own_params, context = layer(params)
        k = k_BJNH if scheme.kv_layout == "bknh" else k_BJNH.transpose(0, 2, 3, 1)
        inside = jnp.zeros((), jnp.float32)
        if overrides["content_query"]:  # a query shift (txl's u): (q + u)·k = q·k + u·k
            shift = scheme.content_query(own_params, jnp.zeros_like(q_BINH[:1, :1]), context)
            by_key = jnp.einsum(f"nh,{scheme.kv_layout}->bnk", shift[0, 0], k, precision="highest")
            inside = by_key[:, :, None, :].astype(jnp.float32)
        if overrides["score_term"]:
            inside = inside + scheme.score_term(
                own_params, q_BINH, k, tile(q_pos_I, k_pos_J), context
            )
        logits = inside * scale
        if overrides["bias"]:
            logits = logits + tile_bias(own_params, context, q_pos_I, k_pos_J)
        return logits

    def tile_bias(own_params, context, q_pos_I, k_pos_J):
        """The tile's bias; a scheme's whose bias depends on the distance alone, from one row of
        the tile's ``I + J − 1`` distances (its last query against keys from the first on), read
        along the diagonals (``toeplitz_index``)."""
        if not scheme.relative:
            return scheme.bias(own_params, tile(q_pos_I, k_pos_J), context)
        rows, keys = q_pos_I.shape[0], k_pos_J.shape[0]
        reach = k_pos_J[0] + jnp.arange(rows + keys - 1, dtype=k_pos_J.dtype)
        row = scheme.bias(own_params, tile(q_pos_I[-1:], reach), context)  # [N or 1, 1, I + J − 1]
        return row[:, 0, toeplitz_index(rows, keys)]

    def value_term(params, weights_BNIJ, q_pos_I, k_pos_J):
        own_params, context = layer(params)
        return scheme.value_term(own_params, weights_BNIJ, tile(q_pos_I, k_pos_J), context)

    def band_query(params, q_BINH):
        own_params, context = layer(params)
        return scheme.band_query(own_params, q_BINH, context) * jnp.asarray(scale, q_BINH.dtype)

    def band_rows(params, top, count):
        own_params, context = layer(params)
        return scheme.band_rows(own_params, context, top, count)

    scale = scheme.scale(cfg)
    adds_logits = overrides["content_query"] or overrides["score_term"] or overrides["bias"]
    return (
        logit_term if adds_logits else None,
        value_term if overrides["value_term"] else None,
        band_term.Band(band_query, band_rows) if band else None,
    )
