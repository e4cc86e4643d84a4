"""The attention layer: multi-head attention over a memory window, where the position scheme is a
plug-in. The layer holds the parameters and projections and applies the scheme's hooks; which
implementation attends (dense, tiled, kernel, ring over the context axis) is ``attention.op``'s.

A segment of T queries attends to K = M + T keys: M memory slots, then the segment itself. The
scheme (``relpos_jax.schemes``) plugs in through the hooks it supplies: a q/k transform, the query of
the content product, a term inside the scaled product, a bias after scaling, and a term on the value
side. Every logit hook sees one ``Tile`` with explicit positions of queries and keys (``rel = q_pos −
k_pos``), which is why every scheme is correct across the memory boundary. The dense logits here
(``logits``) are one tile covering every key: the reference.

Legend: B batch, T queries, M memory, K = M + T keys, N heads, H head dim, D model dim.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from relpos_jax import schemes
from relpos_jax.attention import fused, op
from relpos_jax.attention.position_context import PositionContext
from relpos_jax.config import ModelConfig
from relpos_jax.ops import backend, precision
from relpos_jax.ops.dropout import Dropout
from relpos_jax.schemes import normal_param


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        d, n, h = cfg.d_model, cfg.n_heads, cfg.head_dim
        self.config = cfg
        self.scheme = schemes.get(cfg.position)
        fused.check(cfg)
        # On a CPU, keys and values [B, N, H, K] (each head's keys as columns) where the products
        # and RoPE's rotation read them: the content logits q·kᵀ read them in place, and their
        # gradients reach the projection's backward products without a transposition of single
        # elements; [B, K, N, H] where a scheme gathers keys by row (DeBERTa), and on GPU and
        # TPU, whose libraries read any layout.
        self.kv_layout = self.scheme.kv_layout if backend.on_cpu() else "bknh"
        self.scale = self.scheme.scale(cfg)
        std = cfg.init_std
        self.w_q = normal_param(rngs, (d, n, h), std, ("embed", "heads", "head_dim"))
        # the fused key/value projection
        self.w_kv = normal_param(rngs, (d, 2, n, h), std, ("embed", None, "heads", "head_dim"))
        self.w_o = normal_param(rngs, (n, h, d), std, ("heads", "head_dim", "embed"))
        # the scheme's parameters of this layer, which its tile hooks read (``own``)
        self.position = schemes.Parameters(cfg, self.scheme.layer_params(cfg, rngs))
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
        out_BTNH = op.attend(self, q, k, v, ctx, deterministic)
        return precision.einsum("bqnh,nhd->bqd", out_BTNH, self.w_o[...].astype(q.dtype))

    def probabilities(
        self, x_BTD: jax.Array, window_BKD: jax.Array, ctx: PositionContext
    ) -> jax.Array:
        """The attention probabilities ``[B, N, T, K]`` (before dropout): what ``viz`` draws."""
        q, k, _ = self._project(x_BTD, window_BKD, ctx)
        return self.softmax(q, k, ctx, self.context(ctx, q.dtype))

    def _project(self, x_BTD, window_BKD, ctx: PositionContext):
        """q ``[B, T, N, H]``; k and v laid out as ``self.kv_layout``."""
        w_kv = self.w_kv[...].astype(x_BTD.dtype)
        kv = precision.einsum(f"bkd,dsnh->s{self.kv_layout}", window_BKD, w_kv)
        k, v = jnp.unstack(kv)
        q, k = self._rotate(self._queries(x_BTD), k, ctx)
        return q, k, v

    def _queries(self, x_BTD) -> jax.Array:
        return precision.einsum("btd,dnh->btnh", x_BTD, self.w_q[...].astype(x_BTD.dtype))

    def max_distance(self, ctx: PositionContext) -> int | None:
        """same_length: each query sees itself and the M = K − T keys before it."""
        memory = ctx.k_pos.shape[0] - ctx.q_pos.shape[0]
        return memory if self.config.same_length else None

    def context(self, ctx: PositionContext, dtype) -> Any:
        """The scheme's context as this layer's hooks see it (``Scheme.layer_context``)."""
        return self.scheme.layer_context(self, ctx.scheme, dtype)

    def _rotate(self, q, k, ctx: PositionContext):
        return self.scheme.rotate(self, q, k, ctx.scheme)

    def softmax(self, q, k, ctx: PositionContext, context) -> jax.Array:
        logits = self.logits(q, k, ctx, context)
        logits = jnp.where(ctx.allowed(self.max_distance(ctx)), logits, jnp.finfo(logits.dtype).min)
        return jax.nn.softmax(logits, axis=-1)

    def logits(self, q, k, ctx: PositionContext, context) -> jax.Array:
        """Scaled logits ``[B, N, T, K]`` with every position term, before the mask; ``context``
        is the layer's (``_context``)."""
        scheme, tile = self.scheme, ctx.tile()
        content_q = scheme.content_query(self.position, q, context)
        logits = precision.logits(f"bqnh,{self.kv_layout}->bnqk", content_q, k)
        term = scheme.score_term(self.position, q, k, tile, context)
        if term is not None:
            logits = logits + term
        logits = logits.astype(jnp.promote_types(q.dtype, jnp.float32)) * self.scale
        bias = scheme.bias(self.position, tile, context)
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
        logits = self.logits(*self._rotate(q, k, ctx), ctx, self.context(ctx, q.dtype))
        if not self.scheme.content_carries_positions:
            logits = logits - content
        return logits[0, :, -1]
