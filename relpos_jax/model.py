"""``TransformerLM``: a Transformer language model with segment memory and any position scheme.

The Transformer-XL layout (Dai et al. 2019): token embeddings scaled by √D, a stack of
attention + feed-forward blocks (post-norm as in the paper, pre-norm as an option) whose attention
reads the layer's memory, and a tied (or untied) output projection. With ``position`` in
{sinusoid, learned} and ``mem_len`` 0 it is the vanilla Transformer baseline.

Positions count from the oldest valid key of the attention window (memory, then segment): while the
memory has room they are the positions in the stream (so generation with memory equals recomputing
the context, for every scheme); once it is full, a segment's queries sit at ``M … M + T − 1``.
Relative schemes see only differences, so for them the origin never matters.

``model(tokens, mems) -> (logits, new_mems)``: state goes in and comes out; no hidden cache.
``mems`` is a ``Memory`` of hidden states (training: the current weights project them) or a
``KeyValueMemory`` of projected keys and values (evaluation and generation: only the segment's rows
are projected).
Legend: B batch, T segment, M memory, K = M + T, L layers, D model dim, F feed-forward dim, V vocab.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from relpos_jax import layers, schemes
from relpos_jax import memory as memory_lib
from relpos_jax.adaptive import AdaptiveVocab
from relpos_jax.attention import PositionContext
from relpos_jax.block import Block
from relpos_jax.config import ModelConfig
from relpos_jax.ops import precision
from relpos_jax.ops.dropout import Dropout


def _check_memory(
    mems: memory_lib.AnyMemory, cfg: ModelConfig, batch: int, deterministic: bool
) -> None:
    if isinstance(mems, memory_lib.KeyValueMemory):
        if not deterministic:
            raise ValueError(
                "TransformerLM: mems is a KeyValueMemory, which is exact only where the weights "
                "do not change (evaluation, generation); train with model.init_mems(batch) "
                "(hidden states)"
            )
        name, shape, keys_values = "keys", mems.keys.shape, ", keys_values=True"
        fits = shape[:-1] == (cfg.n_layers, batch, cfg.n_heads, cfg.head_dim)
        fits = fits and mems.values.shape == shape
    else:
        name, shape, keys_values = "states", mems.states.shape, ""
        fits = shape[:2] == (cfg.n_layers, batch)
    if not fits:
        raise ValueError(
            f"TransformerLM: mems.{name}.shape={shape} is invalid; use "
            f"model.init_mems({batch}{keys_values}) for {cfg.n_layers} layers and batch {batch}"
        )


class TransformerLM(nnx.Module):
    """Transformer LM with segment memory; ``model_config`` is ``config.model`` or a ModelConfig."""

    def __init__(self, model_config: Any, *, rngs: nnx.Rngs):
        cfg = self.config = ModelConfig.from_any(model_config)
        d = cfg.d_model
        if cfg.cutoffs:  # adaptive input and softmax: one module for both ends
            self.vocab = AdaptiveVocab(
                cfg.vocab_size, d, cfg.cutoffs, d_embed=cfg.embed_dim, div_val=cfg.div_val,
                tie_weight=cfg.tie_embeddings, tie_projs=cfg.tie_projs,
                init_std=cfg.init_std, rngs=rngs,
            )  # fmt: skip
        else:
            self.embed = nnx.Embed(
                cfg.vocab_size,
                d,
                embedding_init=nnx.initializers.normal(cfg.init_std),
                embedding_metadata={"axes": ("vocab", "embed")},
                dtype=cfg.dtype,
                rngs=rngs,
            )
        # the scheme's parameters shared by every layer, which its context hook reads
        self.position = schemes.Parameters(cfg, schemes.get(cfg.position).shared_params(cfg, rngs))
        self.drop = Dropout(cfg.dropout, rngs=rngs)
        # the L layers as one Block of stacked parameters [L, ...], run by one scan
        self.blocks = layers.stack_blocks(lambda: Block(cfg, rngs=rngs), cfg.n_layers)
        if cfg.pre_norm:
            self.final_norm = nnx.LayerNorm(d, epsilon=1e-5, dtype=cfg.dtype, rngs=rngs)
        if cfg.output_bias:  # the tied softmax's bias (the official code's out_layers[0].bias)
            self.output_bias = nnx.Param(jnp.zeros((cfg.vocab_size,), jnp.float32), axes=("vocab",))
        if not cfg.tie_embeddings and not cfg.cutoffs:
            self.head = nnx.Linear(
                d,
                cfg.vocab_size,
                kernel_init=nnx.initializers.normal(cfg.init_std),
                kernel_metadata={"axes": ("embed", "vocab")},
                bias_metadata={"axes": ("vocab",)},
                dtype=cfg.dtype,
                dot_general=precision.dot_general,
                rngs=rngs,
            )

    def init_mems(
        self, batch_size: int, mem_len: int | None = None, dtype=None, *, keys_values: bool = False
    ) -> memory_lib.AnyMemory:
        """Empty memory for a batch; ``mem_len`` defaults to the config's (evaluation may use more).

        ``keys_values=True`` gives a ``KeyValueMemory``, which keeps each layer's projected keys and
        values instead of its hidden states: the same results where the weights do not change
        between segments (evaluation, generation), without projecting the M slots again."""
        cfg = self.config
        length = cfg.mem_len if mem_len is None else mem_len
        if length < 0:
            raise ValueError(f"init_mems: mem_len={length} is invalid; use 0 (no memory) or more")
        if keys_values:
            return memory_lib.init_key_value_mems(
                cfg.n_layers, batch_size, length, cfg.n_heads, cfg.head_dim, dtype or cfg.dtype
            )
        return memory_lib.init_mems(
            cfg.n_layers, batch_size, length, cfg.d_model, dtype or cfg.dtype
        )

    def layer(self, index: int) -> Block:
        """Layer ``index`` as a ``Block`` of its own: a copy of its slice of the stacked parameters
        (reading weights, analysis); writing to it leaves the model unchanged."""
        return layers.layer(self.blocks, index)

    def __call__(
        self,
        tokens: jax.Array,
        mems: memory_lib.AnyMemory | None = None,
        *,
        deterministic: bool = True,
        position_offset: int | jax.Array = 0,
        attention_mask: jax.Array | None = None,
    ) -> tuple[jax.Array, memory_lib.AnyMemory]:
        """One segment ``tokens [B, T]`` -> ``(logits [B, T, V], new_mems)``.

        ``position_offset`` shifts every query and key position (relative schemes are invariant to
        it); ``attention_mask [T, M + T]`` replaces the causal/memory mask (validity still applies).
        """
        if tokens.ndim != 2:
            raise ValueError(
                f"TransformerLM: tokens.shape={tokens.shape} is invalid; pass [batch, time] ints"
            )
        embeddings = self._token_embeddings(tokens)
        return self.forward_embeddings(
            embeddings,
            mems,
            deterministic=deterministic,
            position_offset=position_offset,
            attention_mask=attention_mask,
        )

    def forward_embeddings(
        self,
        x_BTD: jax.Array,
        mems: memory_lib.AnyMemory | None = None,
        *,
        deterministic: bool = True,
        position_offset: int | jax.Array = 0,
        attention_mask: jax.Array | None = None,
    ) -> tuple[jax.Array, memory_lib.AnyMemory]:
        """The model from (scaled) token embeddings on: what the causality tests differentiate."""
        x, new_mems = self._hidden(
            x_BTD, mems, deterministic=deterministic, position_offset=position_offset,
            attention_mask=attention_mask,
        )  # fmt: skip
        return self._logits(x), new_mems

    def target_log_probs(
        self,
        tokens: jax.Array,
        targets: jax.Array,
        mems: memory_lib.AnyMemory | None = None,
        *,
        deterministic: bool = True,
    ) -> tuple[jax.Array, memory_lib.AnyMemory]:
        """``log p(targets)`` ``[B, T]`` float32 for one segment, and the new memory (what the
        training loss needs). With clusters (``model.cutoffs``) only the targets' probabilities are
        computed (``AdaptiveVocab.log_prob``), never ``[B, T, V]``; else from the logits."""
        x, new_mems = self._hidden(
            self._token_embeddings(tokens), mems, deterministic=deterministic
        )
        if self.config.cutoffs:
            return self.vocab.log_prob(x, targets), new_mems
        losses = optax.softmax_cross_entropy_with_integer_labels(self._logits(x), targets)
        return -losses, new_mems

    def _hidden(
        self,
        x_BTD: jax.Array,
        mems: memory_lib.AnyMemory | None,
        *,
        deterministic: bool,
        position_offset: int | jax.Array = 0,
        attention_mask: jax.Array | None = None,
    ) -> tuple[jax.Array, memory_lib.AnyMemory]:
        """The final hidden states ``[B, T, D]`` (after the final norm and dropout) and the new
        memory."""
        cfg = self.config
        batch, seg_len, _ = x_BTD.shape
        if mems is None:
            mems = self.init_mems(batch)
        _check_memory(mems, cfg, batch, deterministic)
        ctx = self._position_context(mems, seg_len, position_offset, attention_mask, deterministic)
        x = self._add_absolute_positions(x_BTD, ctx.q_pos)
        x = self.drop(x, deterministic=deterministic)
        if isinstance(mems, memory_lib.KeyValueMemory):

            def cached_layer(block, x, memory_k_v):
                x, window_k, window_v = block.with_cached_keys_values(
                    x, *memory_k_v, ctx, deterministic=deterministic
                )
                return x, (window_k, window_v)

            x, (window_keys, window_values) = layers.scan_blocks(
                self.blocks, cached_layer, x, (mems.keys, mems.values),
                deterministic=deterministic, unroll=cfg.scan_unroll,
            )  # fmt: skip
            new_mems = memory_lib.update_key_value_memory(mems, window_keys, window_values)
        else:

            def run_layer(block, x, mem_BMD):  # the memory keeps each layer's input
                return block(x, mem_BMD, ctx, deterministic=deterministic), x

            x, inputs_LBTD = layers.scan_blocks(
                self.blocks, run_layer, x, mems.states, deterministic=deterministic,
                remat=cfg.remat, unroll=cfg.scan_unroll,
            )  # fmt: skip
            new_mems = memory_lib.update_memory(mems, inputs_LBTD)
        if cfg.pre_norm:
            x = self.final_norm(x)
        return self.drop(x, deterministic=deterministic), new_mems

    def _logits(self, x_BTD: jax.Array) -> jax.Array:
        """``[B, T, V]`` float32 from the final hidden states."""
        cfg = self.config
        if cfg.cutoffs:  # every word's log-probability: the logits of a normalised softmax
            logits = self.vocab.log_probs(x_BTD)
        elif cfg.tie_embeddings:
            embedding = self.embed.embedding[...].astype(x_BTD.dtype)
            logits = precision.einsum("btd,vd->btv", x_BTD, embedding, out_dtype=jnp.float32)
            if cfg.output_bias:
                logits = precision.add_bias(logits, self.output_bias[...])
        else:
            logits = self.head(x_BTD)
        return logits.astype(jnp.float32)

    def _token_embeddings(self, tokens: jax.Array) -> jax.Array:
        """``[B, T]`` ids -> ``[B, T, D]``, scaled by √D as Transformer-XL does."""
        if self.config.cutoffs:
            return self.vocab.embed(tokens, self.config.dtype)
        return self.embed(tokens) * math.sqrt(self.config.d_model)

    def attention_probabilities(
        self, tokens: jax.Array, mems: memory_lib.Memory | None = None, *, layer: int = 0
    ) -> jax.Array:
        """Layer ``layer``'s attention probabilities ``[B, N, T, M + T]`` for one segment (no
        dropout); keys are the memory slots, then the segment."""
        if not 0 <= layer < self.config.n_layers:
            raise ValueError(
                f"attention_probabilities: layer={layer} is invalid; use 0…{self.config.n_layers - 1}"
            )
        mems = self.init_mems(tokens.shape[0]) if mems is None else mems
        if not isinstance(mems, memory_lib.Memory):
            raise ValueError(
                "attention_probabilities: mems is a KeyValueMemory; pass a memory of hidden states "
                "(model.init_mems(batch) without keys_values)"
            )
        ctx = self._position_context(mems, tokens.shape[1], 0, None, True)
        x = self._token_embeddings(tokens)
        x = self._add_absolute_positions(x, ctx.q_pos)
        x, _ = layers.scan_blocks(
            self.blocks,
            lambda block, x, mem_BMD: (block(x, mem_BMD, ctx, deterministic=True), None),
            x,
            mems.states,
            layers=slice(0, layer),
        )
        return self.layer(layer).attention_probabilities(x, mems.states[layer], ctx)

    def position_logits(
        self, layer: int, query_NH: jax.Array, key_NH: jax.Array, max_distance: int
    ) -> jax.Array:
        """``[N, max_distance + 1]``: what layer ``layer``'s position scheme adds to the logit of a
        query against a key ``d = 0 … max_distance`` positions back (``Attention.position_logits``),
        through the model's own attention code; what ``analysis.viz`` plots."""
        if not 0 <= layer < self.config.n_layers:
            raise ValueError(
                f"position_logits: layer={layer} is invalid; use 0…{self.config.n_layers - 1}"
            )
        cfg = self.config  # one query after max_distance written memory slots
        states = jnp.zeros((cfg.n_layers, 1, max_distance, cfg.d_model), cfg.dtype)
        mems = memory_lib.Memory(states, jnp.asarray(max_distance, jnp.int32))
        ctx = self._position_context(mems, 1, 0, None, True)
        attention = self.layer(layer).attention
        by_key = attention.position_logits(jnp.asarray(query_NH), jnp.asarray(key_NH), ctx)
        return by_key[:, ::-1]  # column d: the key d positions back

    def _add_absolute_positions(self, x_BTD: jax.Array, q_pos: jax.Array) -> jax.Array:
        return schemes.get(self.config.position).embed(self, x_BTD, q_pos)

    def _position_context(
        self, mems, seg_len, offset, attention_mask, deterministic
    ) -> PositionContext:
        cfg = self.config
        mem_len = mems.length
        k_len = mem_len + seg_len
        origin = mem_len - mems.valid  # the oldest valid key sits at position 0 (+ offset)
        k_pos = jnp.arange(k_len) - origin + offset
        q_pos = k_pos[mem_len:]
        if attention_mask is not None and attention_mask.shape != (seg_len, k_len):
            raise ValueError(
                f"TransformerLM: attention_mask.shape={attention_mask.shape} is invalid; "
                f"pass [{seg_len}, {k_len}] (segment, memory + segment)"
            )
        scheme = schemes.get(cfg.position).context(self, q_pos, k_pos, deterministic)
        return PositionContext(
            q_pos,
            k_pos,
            mask=attention_mask,
            key_valid=memory_lib.key_validity(mems, seg_len),
            scheme=scheme,
        )
