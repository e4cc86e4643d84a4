"""Multi-head attention over a memory window, where the position scheme is a plug-in.

A segment of T queries attends to K = M + T keys: M memory slots, then the segment itself. The
scheme (``relpos_jax.schemes``) plugs in through the hooks it supplies: a q/k transform, the query of
the content product, a term inside the scaled product, a bias after scaling, and a term on the value
side. Every logit hook sees one ``Tile`` with explicit positions of queries and keys (``rel = q_pos −
k_pos``), which is why every scheme is correct across the memory boundary. The dense path is one
tile covering every key: the reference, and the fastest at short lengths.

Legend: B batch, T queries, M memory, K = M + T keys, N heads, H head dim, D model dim.
"""

from __future__ import annotations

import functools
import types
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from relpos_jax import schemes
from relpos_jax.attention import band as band_term
from relpos_jax.attention import context as context_parallel
from relpos_jax.attention import fused, tile, tiled
from relpos_jax.config import ModelConfig
from relpos_jax.ops import backend, precision
from relpos_jax.ops.dropout import Dropout
from relpos_jax.schemes import Tile, normal_param


class PositionContext(NamedTuple):
    """What every layer needs about positions, built once per forward pass by the model.

    Query t may attend key k when ``key_valid[k]`` and ``0 ≤ q_pos[t] − k_pos[k]`` (with
    same_length, at most M = K − T), or, when ``mask [T, K]`` is given, when ``mask[t, k]``.
    Nothing of size T·K is kept here: the dense path builds the ``[T, K]`` mask (``allowed``), the
    tiled path a tile's."""

    q_pos: jax.Array  # [T] int
    k_pos: jax.Array  # [K] int
    mask: jax.Array | None = None  # [T, K] bool: replaces the causal rule (tests, probes)
    key_valid: jax.Array | None = None  # [K] bool: memory slots that hold states
    scheme: Any = None  # the scheme's own context (Scheme.context), a pytree

    def tile(self) -> Tile:
        """The whole window as one tile: the queries are its last T positions."""
        return Tile(self.q_pos, self.k_pos, self.k_pos.shape[0] - self.q_pos.shape[0], 0)

    def allowed(self, max_distance: int | None) -> jax.Array:
        """``[T, K]`` bool: which keys each query may attend (the dense path's mask); keys more than
        ``max_distance`` back are out (same_length)."""
        return tile.allowed(
            self.q_pos, self.k_pos, self.key_valid, max_distance=max_distance, mask_IJ=self.mask
        )


@functools.cache
def toeplitz_index(rows: int, keys: int) -> np.ndarray:
    """``[I, J]``: where pair (i, j) of a tile, at distance ``δ + i − j``, reads the row of its
    distances ``δ + I − 1`` (the last query against the first key) down to ``δ − J + 1``."""
    return (rows - 1) - np.arange(rows)[:, None] + np.arange(keys)[None, :]


@functools.cache
def tiled_hooks(cfg: ModelConfig, memory: int):
    """The scheme's hooks as the tile callbacks of ``attention.tiled.attend``: ``logit_term`` gives
    a tile's logits beyond ``scale·q·k`` (the content query's shift, the score term, the bias),
    ``value_term`` its value side, ``band`` the score term of a scheme that gives it as a band
    (``band_query``, ``band_rows``: scored once per distance); None where the scheme adds nothing.
    ``params`` is (the layer's parameters by name, the layer's context: ``Scheme.layer_context``);
    of a tile's window starts (``Tile.q_start``, ``k_start``) only their difference matters, and
    it follows from the positions (``q_start`` is set as if the tile's first query were the
    segment's first, after ``memory`` slots). Cached per (config, memory): the same callables, so
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
        return types.SimpleNamespace(config=cfg, **arrays), context

    def tile(q_pos_I, k_pos_J) -> Tile:
        return Tile(q_pos_I, k_pos_J, memory, memory + k_pos_J[0] - q_pos_I[0])

    def logit_term(params, q_BINH, k_BJNH, q_pos_I, k_pos_J):
        attention, context = layer(params)
        k = k_BJNH if scheme.kv_layout == "bknh" else k_BJNH.transpose(0, 2, 3, 1)
        inside = jnp.zeros((), jnp.float32)
        if overrides["content_query"]:  # a query shift (txl's u): (q + u)·k = q·k + u·k
            shift = scheme.content_query(attention, jnp.zeros_like(q_BINH[:1, :1]), context)
            by_key = jnp.einsum(f"nh,{scheme.kv_layout}->bnk", shift[0, 0], k, precision="highest")
            inside = by_key[:, :, None, :].astype(jnp.float32)
        if overrides["score_term"]:
            inside = inside + scheme.score_term(
                attention, q_BINH, k, tile(q_pos_I, k_pos_J), context
            )
        logits = inside * scale
        if overrides["bias"]:
            logits = logits + tile_bias(attention, context, q_pos_I, k_pos_J)
        return logits

    def tile_bias(attention, context, q_pos_I, k_pos_J):
        """The tile's bias; a scheme's whose bias depends on the distance alone, from one row of
        the tile's ``I + J − 1`` distances (its last query against keys from the first on), read
        along the diagonals (``toeplitz_index``)."""
        if not scheme.relative:
            return scheme.bias(attention, tile(q_pos_I, k_pos_J), context)
        rows, keys = q_pos_I.shape[0], k_pos_J.shape[0]
        reach = k_pos_J[0] + jnp.arange(rows + keys - 1, dtype=k_pos_J.dtype)
        row = scheme.bias(attention, tile(q_pos_I[-1:], reach), context)  # [N or 1, 1, I + J − 1]
        return row[:, 0, toeplitz_index(rows, keys)]

    def value_term(params, weights_BNIJ, q_pos_I, k_pos_J):
        attention, context = layer(params)
        return scheme.value_term(attention, weights_BNIJ, tile(q_pos_I, k_pos_J), context)

    def band_query(params, q_BINH):
        attention, context = layer(params)
        return scheme.band_query(attention, q_BINH, context) * jnp.asarray(scale, q_BINH.dtype)

    def band_rows(params, top, count):
        attention, context = layer(params)
        return scheme.band_rows(attention, context, top, count)

    scale = scheme.scale(cfg)
    adds_logits = overrides["content_query"] or overrides["score_term"] or overrides["bias"]
    return (
        logit_term if adds_logits else None,
        value_term if overrides["value_term"] else None,
        band_term.Band(band_query, band_rows) if band else None,
    )


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        d, n, h = cfg.d_model, cfg.n_heads, cfg.head_dim
        self.config = cfg
        self.scheme = schemes.get(cfg.position)
        fused.check(cfg)
        # On a CPU, keys and values [B, N, H, K] (each head's keys as columns) where the products
        # and RoPE's rotation read them: the content logits q·kᵀ read them in place, and their
        # gradients reach the projection's backward products without a transposition of single
        # elements (bf16 Transformer-XL step −3%, RoPE −8 to −13%); [B, K, N, H] where a scheme
        # gathers keys by row (DeBERTa), and on GPU and TPU, whose libraries read any layout.
        self.kv_layout = self.scheme.kv_layout if backend.on_cpu() else "bknh"
        self.scale = self.scheme.scale(cfg)
        std = cfg.init_std
        self.w_q = normal_param(rngs, (d, n, h), std, ("embed", "heads", "head_dim"))
        # the fused key/value projection
        self.w_kv = normal_param(rngs, (d, 2, n, h), std, ("embed", None, "heads", "head_dim"))
        self.w_o = normal_param(rngs, (n, h, d), std, ("heads", "head_dim", "embed"))
        scheme_params = self.scheme.layer_params(cfg, rngs)
        for name, param in scheme_params.items():
            setattr(self, name, param)
        self.scheme_params = tuple(scheme_params)  # what the tiles see of the layer's parameters
        self.dropatt = Dropout(cfg.dropatt, rngs=rngs)

    def __call__(
        self, x_BTD: jax.Array, window_BKD: jax.Array, ctx: PositionContext, *, deterministic: bool
    ) -> jax.Array:
        """Queries from ``x`` (the segment), keys and values from ``window`` (memory + segment)."""
        q, k, v = self._project(x_BTD, window_BKD, ctx)
        return self._attend(q, k, v, ctx, deterministic)

    def with_cached_keys_values(
        self, x_BTD: jax.Array, memory_k, memory_v, ctx: PositionContext, *, deterministic: bool
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """Attention whose memory slots come already projected, keys and values ``[B, N, H, M]``:
        only the segment's T rows are projected. Returns the output and the window's keys and
        values ``[B, N, H, M + T]`` (keys before RoPE's rotation), which the next memory is cut
        from."""
        dtype = x_BTD.dtype
        segment_kv = precision.einsum("btd,dsnh->sbnht", x_BTD, self.w_kv[...].astype(dtype))
        window_k, window_v = (
            precision.append_last(memory.astype(dtype), segment)
            for memory, segment in zip((memory_k, memory_v), jnp.unstack(segment_kv), strict=True)
        )
        k, v = window_k, window_v
        if self.kv_layout == "bknh":  # [B, N, H, K] -> [B, K, N, H]
            k, v = k.transpose(0, 3, 1, 2), v.transpose(0, 3, 1, 2)
        q, k = self._rotate(self._queries(x_BTD), k, ctx)
        return self._attend(q, k, v, ctx, deterministic), window_k, window_v

    def _attend(self, q, k, v, ctx: PositionContext, deterministic: bool) -> jax.Array:
        dtype = q.dtype
        split = context_parallel.splits(q.shape[1], k.shape[1])
        keys = k.shape[-1 if self.kv_layout == "bnhk" else 1]
        impl = fused.path(self.config, q.shape[1], keys, ctx.mask, split)
        if impl == "kernel":
            out = self._fused(q, k, v, ctx, deterministic)
        elif impl == "tiled":
            out = self._tiled(q, k, v, ctx, deterministic)
        else:
            context = self._context(ctx, dtype)  # once: the logits and the value side
            weights = self._softmax(q, k, ctx, context)
            weights = self.dropatt(weights, deterministic=deterministic).astype(dtype)
            out = precision.einsum(f"bnqk,{self.kv_layout}->bqnh", weights, v)
            value_term = self.scheme.value_term(self, weights, ctx.tile(), context)
            if value_term is not None:
                out = out + value_term
        return precision.einsum("bqnh,nhd->bqd", out, self.w_o[...].astype(dtype))

    def _fused(self, q, k, v, ctx: PositionContext, deterministic: bool) -> jax.Array:
        """``attention.fused``: the Pallas kernels, the scheme's terms as tables by distance."""
        if self.kv_layout == "bnhk":  # [B, K, N, H]
            k, v = k.transpose(0, 3, 1, 2), v.transpose(0, 3, 1, 2)
        rate = 0.0 if deterministic else self.dropatt.rate
        key = self.dropatt.next_key() if rate else None
        return fused.attend(self, q, k, v, ctx, self._context(ctx, q.dtype), rate, key)

    def _tiled(self, q, k, v, ctx: PositionContext, deterministic: bool) -> jax.Array:
        """``attention.tiled.attend`` over tiles of ``query_tile`` queries by ``key_tile`` keys:
        the scheme's hooks on each tile (``tiled_hooks``), nothing of size T·K live, forward or
        backward."""
        if self.kv_layout == "bnhk":  # the tiles are cut along K: [B, K, N, H]
            k, v = k.transpose(0, 3, 1, 2), v.transpose(0, 3, 1, 2)
        rate = 0.0 if deterministic else self.dropatt.rate
        key = self.dropatt.next_key() if rate else None
        params = (
            {n: getattr(self, n)[...] for n in self.scheme_params},
            self._context(ctx, q.dtype),
        )
        logit_term, value_term, band = tiled_hooks(self.config, k.shape[1] - q.shape[1])
        valid = ctx.key_valid if ctx.key_valid is not None else jnp.ones(k.shape[1], bool)
        hooks = dict(
            scale=self.scale, logit_term=logit_term, value_term=value_term, band=band,
            max_distance=self._max_distance(ctx), dropatt=rate,
        )  # fmt: skip
        split = context_parallel.splits(q.shape[1], k.shape[1])  # the mesh splits the segment
        return (context_parallel.attend if split else tiled.attend)(
            q, k, v, q_pos=ctx.q_pos, k_pos=ctx.k_pos, key_valid=valid, params=params,
            mask=ctx.mask, dropout_key=key, key_tile=self.config.key_tile,
            query_tile=self.config.query_tile, **hooks,
        )  # fmt: skip

    def probabilities(
        self, x_BTD: jax.Array, window_BKD: jax.Array, ctx: PositionContext
    ) -> jax.Array:
        """The attention probabilities ``[B, N, T, K]`` (before dropout): what ``viz`` draws."""
        q, k, _ = self._project(x_BTD, window_BKD, ctx)
        return self._softmax(q, k, ctx, self._context(ctx, q.dtype))

    def _project(self, x_BTD, window_BKD, ctx: PositionContext):
        """q ``[B, T, N, H]``; k and v laid out as ``self.kv_layout``."""
        w_kv = self.w_kv[...].astype(x_BTD.dtype)
        kv = precision.einsum(f"bkd,dsnh->s{self.kv_layout}", window_BKD, w_kv)
        k, v = jnp.unstack(kv)
        q, k = self._rotate(self._queries(x_BTD), k, ctx)
        return q, k, v

    def _queries(self, x_BTD) -> jax.Array:
        return precision.einsum("btd,dnh->btnh", x_BTD, self.w_q[...].astype(x_BTD.dtype))

    def _max_distance(self, ctx: PositionContext) -> int | None:
        """same_length: each query sees itself and the M = K − T keys before it."""
        memory = ctx.k_pos.shape[0] - ctx.q_pos.shape[0]
        return memory if self.config.same_length else None

    def _context(self, ctx: PositionContext, dtype) -> Any:
        """The scheme's context as this layer's hooks see it (``Scheme.layer_context``)."""
        return self.scheme.layer_context(self, ctx.scheme, dtype)

    def _rotate(self, q, k, ctx: PositionContext):
        return self.scheme.rotate(self, q, k, ctx.scheme)

    def _softmax(self, q, k, ctx: PositionContext, context) -> jax.Array:
        logits = self._logits(q, k, ctx, context)
        logits = jnp.where(
            ctx.allowed(self._max_distance(ctx)), logits, jnp.finfo(logits.dtype).min
        )
        return jax.nn.softmax(logits, axis=-1)

    def _logits(self, q, k, ctx: PositionContext, context) -> jax.Array:
        """Scaled logits ``[B, N, T, K]`` with every position term, before the mask; ``context``
        is the layer's (``_context``)."""
        scheme, tile = self.scheme, ctx.tile()
        content_q = scheme.content_query(self, q, context)
        logits = precision.logits(f"bqnh,{self.kv_layout}->bnqk", content_q, k)
        term = scheme.score_term(self, q, k, tile, context)
        if term is not None:
            logits = logits + term
        logits = logits.astype(jnp.promote_types(q.dtype, jnp.float32)) * self.scale
        bias = scheme.bias(self, tile, context)
        if bias is not None:  # [N, T, K] over the batch: its gradient by sum_leading
            logits = precision.add_bias(logits, bias)
        return logits

    def position_logits(self, q_NH: jax.Array, k_NH: jax.Array, ctx: PositionContext) -> jax.Array:
        """What this layer's scheme adds to the logit of query ``q_NH`` (the last position of
        ``ctx``'s window) against key ``k_NH`` at each key of the window, beyond the plain content
        product ``scale·q·k`` (RoPE's whole logit, since its positions act inside that product):
        ``[N, K]`` with column j at distance ``K − 1 − j``. The bias against distance of the plots,
        computed by the same code as the model's logits."""
        n, h = q_NH.shape
        k_len = ctx.k_pos.shape[0]
        q = jnp.broadcast_to(q_NH, (1, 1, n, h))
        k = jnp.broadcast_to(k_NH, (1, k_len, n, h))
        if self.kv_layout == "bnhk":
            k = k.transpose(0, 2, 3, 1)
        content = self.scale * precision.logits(f"bqnh,{self.kv_layout}->bnqk", q, k)
        logits = self._logits(*self._rotate(q, k, ctx), ctx, self._context(ctx, q.dtype))
        if not self.scheme.content_carries_positions:
            logits = logits - content
        return logits[0, :, -1]
