"""One Transformer-XL layer: attention over the layer's memory window, then the feed-forward
network, each with a residual connection and layer norm (post-norm as in the paper, pre-norm as an
option). The model holds its L layers as one Block of stacked parameters (``relpos_jax.layers``).

Legend: B batch, T segment, M memory, D model dim, F feed-forward dim.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from relpos_jax.attention import Attention, PositionContext
from relpos_jax.config import ModelConfig
from relpos_jax.ops import precision
from relpos_jax.ops.dropout import Dropout


class Dense(nnx.Linear):
    """``nnx.Linear`` (same parameters) whose bias is added by ``precision.add_bias``."""

    def __call__(self, inputs: jax.Array) -> jax.Array:
        inputs, kernel = self.promote_dtype((inputs, self.kernel[...]), dtype=self.dtype)
        y = self.dot_general(inputs, kernel, (((inputs.ndim - 1,), (0,)), ((), ())))
        return y if self.bias is None else precision.add_bias(y, self.bias[...])


class FeedForward(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        dense = functools.partial(
            Dense,
            kernel_init=nnx.initializers.normal(cfg.init_std),
            dtype=cfg.dtype,
            dot_general=precision.dot_general,
            rngs=rngs,
        )
        self.up = dense(
            cfg.d_model, cfg.d_ff,
            kernel_metadata={"axes": ("embed", "mlp")}, bias_metadata={"axes": ("mlp",)},
        )  # fmt: skip
        self.down = dense(cfg.d_ff, cfg.d_model, kernel_metadata={"axes": ("mlp", "embed")})
        self.drop = Dropout(cfg.dropout, rngs=rngs)

    def __call__(self, x: jax.Array, *, deterministic: bool) -> jax.Array:
        hidden = self.drop(jax.nn.relu(self.up(x)), deterministic=deterministic)
        return self.drop(self.down(hidden), deterministic=deterministic)


class Block(nnx.Module):
    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        self.pre_norm = cfg.pre_norm
        self.attention = Attention(cfg, rngs=rngs)
        self.feed_forward = FeedForward(cfg, rngs=rngs)
        self.norm_attention = nnx.LayerNorm(cfg.d_model, epsilon=1e-5, dtype=cfg.dtype, rngs=rngs)
        self.norm_feed_forward = nnx.LayerNorm(
            cfg.d_model, epsilon=1e-5, dtype=cfg.dtype, rngs=rngs
        )
        self.drop = Dropout(cfg.dropout, rngs=rngs)

    def __call__(self, x_BTD, mem_BMD, ctx: PositionContext, *, deterministic: bool) -> jax.Array:
        queries, window = self._attention_inputs(x_BTD, mem_BMD)
        attended = self.attention(queries, window, ctx, deterministic=deterministic)
        return self._residual_and_feed_forward(x_BTD, attended, deterministic)

    def with_cached_keys_values(
        self, x_BTD, memory_k, memory_v, ctx: PositionContext, *, deterministic: bool
    ) -> tuple[jax.Array, jax.Array, jax.Array]:
        """The block over a memory of projected keys and values (``KeyValueMemory``): returns the
        output and the window's keys and values ``[B, N, H, M + T]``."""
        queries = self.norm_attention(x_BTD) if self.pre_norm else x_BTD  # norms act row by row
        attended, window_k, window_v = self.attention.with_cached_keys_values(
            queries, memory_k, memory_v, ctx, deterministic=deterministic
        )
        return self._residual_and_feed_forward(x_BTD, attended, deterministic), window_k, window_v

    def _residual_and_feed_forward(self, x_BTD, attended, deterministic: bool) -> jax.Array:
        if self.pre_norm:
            x = x_BTD + self.drop(attended, deterministic=deterministic)
            return x + self.feed_forward(self.norm_feed_forward(x), deterministic=deterministic)
        x = self.norm_attention(x_BTD + self.drop(attended, deterministic=deterministic))
        return self.norm_feed_forward(x + self.feed_forward(x, deterministic=deterministic))

    def attention_probabilities(self, x_BTD, mem_BMD, ctx: PositionContext) -> jax.Array:
        return self.attention.probabilities(*self._attention_inputs(x_BTD, mem_BMD), ctx)

    def _attention_inputs(self, x_BTD, mem_BMD) -> tuple[jax.Array, jax.Array]:
        """(queries' input, keys' window): pre-norm normalises memory + segment together."""
        window = jnp.concatenate([mem_BMD.astype(x_BTD.dtype), x_BTD], axis=1)
        if self.pre_norm:
            window = self.norm_attention(window)
            return window[:, mem_BMD.shape[1] :], window
        return x_BTD, window
