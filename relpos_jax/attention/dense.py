"""Multi-head attention over a memory window, where the position scheme is a choice.

A segment of T queries attends to K = M + T keys: M memory slots, then the segment itself. The
scheme plugs in through the hooks it needs; every hook sees explicit positions of queries and keys
(``rel = q_pos − k_pos``), which is why every scheme is correct across the memory boundary:

=================  ======================================================================
hook               schemes
=================  ======================================================================
input embedding    sinusoid, learned (added by the model, not here)
rotate q and k     rope (keys rotated by their own positions, memory included)
logit bias         alibi, t5 (``[N, T, K]``, built once per forward by the model)
content x position txl (``(q + v)·W_R·R`` via rel_shift, plus ``u·k``), shaw key side,
                   deberta c2p + p2c
value side         shaw
=================  ======================================================================

Transformer-XL: ``A_ij = (q_i + u)ᵀk_j + (q_i + v)ᵀ W_R R_{i−j}``, scaled by 1/√d_head, u and v global
(shared by all layers, or per layer with ``untie_r``). DeBERTa scales by 1/√(3·d_head).
Legend: B batch, T queries, M memory, K = M + T keys, N heads, H head dim, D model dim, R table rows.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx

from relpos_jax import positions as P
from relpos_jax.config import ModelConfig
from relpos_jax.ops import precision
from relpos_jax.ops.dropout import Dropout


class PositionContext(NamedTuple):
    """What every layer needs about positions, built once per forward pass by the model."""

    q_pos: jax.Array  # [T] int
    k_pos: jax.Array  # [K] int
    mask: jax.Array  # [T, K] bool: may query t attend to key k
    bias: jax.Array | None = None  # [N, T, K] alibi / t5
    r_KD: jax.Array | None = None  # txl: sinusoid of distances K − 1 … 0 (after dropout)
    u: jax.Array | None = None  # txl shared content bias [N, H]
    v: jax.Array | None = None  # txl shared position bias [N, H]
    rel_RD: jax.Array | None = None  # deberta shared relative embeddings
    rel_index: jax.Array | None = None  # deberta [T, K] rows of rel_RD
    rope_q: tuple[jax.Array, jax.Array] | None = None  # rope: (cos, sin) [T, R/2] of the queries
    rope_k: tuple[jax.Array, jax.Array] | None = None  # and of the keys [K, R/2]


def _logits_einsum(spec: str, a: jax.Array, b: jax.Array) -> jax.Array:
    return precision.einsum(spec, a, b, out_dtype=jnp.float32)


def _kv_layout(position: str) -> str:
    """The axis order of keys and values: ``bnhk`` (each head's keys as columns) where the products
    and RoPE's rotation read them, ``bknh`` (the window's order) where DeBERTa gathers them by row.

    On a CPU the content logits ``q·kᵀ`` read ``[B, N, H, K]`` keys in place, and the key and value
    gradients, which the products emit as ``[B, N, H, K]``, reach the key/value projection's
    backward products without a transposition of single elements (bf16 Transformer-XL training
    step −3%; RoPE, whose keys are rotated along rows by ``rotate_columns``, −8 to −13%)."""
    return "bknh" if position == "deberta" else "bnhk"


def normal_param(rngs: nnx.Rngs, shape: tuple[int, ...], std: float) -> nnx.Param:
    return nnx.Param(std * jax.random.normal(rngs.params(), shape, jnp.float32))


class Attention(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        d, n, h = cfg.d_model, cfg.n_heads, cfg.head_dim
        self.position = cfg.position
        self.kv_layout = _kv_layout(cfg.position)
        self.rope_interleaved = cfg.rope_interleaved
        self.scale = 1.0 / math.sqrt(h * (3 if cfg.position == "deberta" else 1))
        self.w_q = normal_param(rngs, (d, n, h), cfg.init_std)
        self.w_kv = normal_param(rngs, (d, 2, n, h), cfg.init_std)  # fused key/value projection
        self.w_o = normal_param(rngs, (n, h, d), cfg.init_std)
        if cfg.position == "txl":
            self.w_r = normal_param(rngs, (d, n, h), cfg.init_std)
            if cfg.untie_r:
                self.u = normal_param(rngs, (n, h), cfg.init_std)
                self.v = normal_param(rngs, (n, h), cfg.init_std)
        if cfg.position == "shaw":
            rows = 2 * cfg.shaw_max_distance + 1
            self.table_k = normal_param(rngs, (rows, h), cfg.init_std)
            self.table_v = normal_param(rngs, (rows, h), cfg.init_std)
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
        weights = self._softmax(q, k, ctx)
        weights = self.dropatt(weights, deterministic=deterministic).astype(dtype)

        out = precision.einsum(f"bnqk,{self.kv_layout}->bqnh", weights, v)
        if self.position == "shaw":
            out = out + P.shaw_value_output(
                weights, self.table_v[...].astype(dtype), ctx.q_pos, ctx.k_pos
            )
        return precision.einsum("bqnh,nhd->bqd", out, self.w_o[...].astype(dtype))

    def probabilities(
        self, x_BTD: jax.Array, window_BKD: jax.Array, ctx: PositionContext
    ) -> jax.Array:
        """The attention probabilities ``[B, N, T, K]`` (before dropout): what ``viz`` draws."""
        q, k, _ = self._project(x_BTD, window_BKD, ctx)
        return self._softmax(q, k, ctx)

    def _project(self, x_BTD, window_BKD, ctx: PositionContext):
        """q ``[B, T, N, H]``; k and v laid out as ``self.kv_layout``."""
        w_kv = self.w_kv[...].astype(x_BTD.dtype)
        kv = precision.einsum(f"bkd,dsnh->s{self.kv_layout}", window_BKD, w_kv)
        k, v = jnp.unstack(kv)
        q, k = self._rotate(self._queries(x_BTD), k, ctx)
        return q, k, v

    def _queries(self, x_BTD) -> jax.Array:
        return precision.einsum("btd,dnh->btnh", x_BTD, self.w_q[...].astype(x_BTD.dtype))

    def _rotate(self, q, k, ctx: PositionContext):
        if self.position == "rope":
            q = P.rotate(q, *ctx.rope_q, interleaved=self.rope_interleaved)
            k = P.rotate_columns(k, *ctx.rope_k, interleaved=self.rope_interleaved)
        return q, k

    def _softmax(self, q, k, ctx: PositionContext) -> jax.Array:
        logits = self._logits(q, k, ctx)
        logits = jnp.where(ctx.mask, logits, jnp.finfo(logits.dtype).min)
        return jax.nn.softmax(logits, axis=-1)

    def _logits(self, q, k, ctx: PositionContext) -> jax.Array:
        """Scaled logits ``[B, N, T, K]`` with every position term, before the mask."""
        logits = self._content_and_position_logits(q, k, ctx)
        logits = logits.astype(jnp.promote_types(q.dtype, jnp.float32)) * self.scale
        if ctx.bias is not None:  # [N, T, K] over the batch: its gradient by sum_leading
            logits = precision.add_bias(logits, ctx.bias)
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
        content = self.scale * _logits_einsum(f"bqnh,{self.kv_layout}->bnqk", q, k)
        logits = self._logits(*self._rotate(q, k, ctx), ctx)
        if self.position != "rope":
            logits = logits - content
        return logits[0, :, -1]

    def _content_and_position_logits(self, q, k, ctx: PositionContext) -> jax.Array:
        dtype = q.dtype
        if self.position == "txl":
            u = (self.u if hasattr(self, "u") else ctx.u)[...]
            v = (self.v if hasattr(self, "v") else ctx.v)[...]
            r_KNH = precision.einsum(
                "kd,dnh->knh", ctx.r_KD.astype(dtype), self.w_r[...].astype(dtype)
            )
            q_u, q_v = precision.add_bias(q, u), precision.add_bias(q, v)
            content = _logits_einsum(f"bqnh,{self.kv_layout}->bnqk", q_u, k)
            return content + P.txl_position_logits(q_v, r_KNH, einsum=_logits_einsum)
        content = _logits_einsum(f"bqnh,{self.kv_layout}->bnqk", q, k)
        if self.position == "shaw":
            return content + P.shaw_key_logits(
                q, self.table_k[...].astype(dtype), ctx.q_pos, ctx.k_pos
            )
        if self.position == "deberta":
            rel = ctx.rel_RD.astype(dtype)  # DeBERTa-v3 share_att_key: the content projections
            pos_key = jnp.einsum("rd,dnh->rnh", rel, self.w_kv[...][:, 0].astype(dtype))
            pos_query = jnp.einsum("rd,dnh->rnh", rel, self.w_q[...].astype(dtype))
            return (
                content
                + P.deberta_c2p(q, pos_key, ctx.rel_index)
                + P.deberta_p2c(k, pos_query, ctx.rel_index)
            )
        return content
