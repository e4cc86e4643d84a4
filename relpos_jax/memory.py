"""Segment-level recurrence (Transformer-XL section 3.2): memory as an explicit pytree.

``Memory.states [L, B, M, D]`` holds, for each layer, the last M hidden states that entered that
layer (the input of layer l, as in the paper); ``Memory.valid`` counts how many of the M slots have
been written, so that the first segments attend to nothing that was never computed. Slots are
right-aligned: the newest state is last. The update keeps the last M of concat(memory, new states)
— in that order; the official code swaps the two in ``_update_mems``, which only shows with
``ext_len > 0`` — under ``stop_gradient``: gradients never cross a segment boundary.

``KeyValueMemory`` is the same memory after each layer's key and value projections: ``keys`` and
``values`` ``[L, B, N, H, M]`` (keys before RoPE's rotation). A slot's keys and values are those its
hidden state had when it was the segment, so where the weights do not change between segments
(evaluation, generation) a layer projects only the T new rows instead of all M + T. In training it
would differ from Transformer-XL, whose memory is projected by the current weights (and whose
key/value weights get gradients through the memory's rows): training keeps ``Memory``.

``segment_step`` is the one step over segments (the model on a segment, the memory carried, a
readout of what the caller keeps); ``scan_segments`` scans it with the memory as the
``jax.lax.scan`` carry, and ``run_segments`` splits a long stream into segments for it. Evaluation,
RECL, the probes and generation all run through ``segment_step``.
Legend: L layers, B batch, M memory slots, T segment length, S segments, D model dim, N heads, H head
dim, V vocab.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
from flax import nnx


class Memory(NamedTuple):
    states: jax.Array  # [L, B, M, D]
    valid: jax.Array  # int32 scalar: how many of the M slots hold real states

    @property
    def length(self) -> int:
        """M, the number of slots."""
        return self.states.shape[2]


class KeyValueMemory(NamedTuple):
    keys: jax.Array  # [L, B, N, H, M]: each layer's keys of the M slots (before RoPE's rotation)
    values: jax.Array  # [L, B, N, H, M]
    valid: jax.Array  # int32 scalar: how many of the M slots hold real states

    @property
    def length(self) -> int:
        return self.keys.shape[-1]


AnyMemory = Memory | KeyValueMemory


def init_mems(
    n_layers: int, batch_size: int, mem_len: int, d_model: int, dtype=jnp.float32
) -> Memory:
    """Empty memory: M slots per layer, none of them valid yet."""
    return Memory(
        jnp.zeros((n_layers, batch_size, mem_len, d_model), dtype), jnp.zeros((), jnp.int32)
    )


def init_key_value_mems(
    n_layers: int, batch_size: int, mem_len: int, n_heads: int, head_dim: int, dtype=jnp.float32
) -> KeyValueMemory:
    """Empty key/value memory: M slots per layer, none of them valid yet."""
    shape = (n_layers, batch_size, n_heads, head_dim, mem_len)
    return KeyValueMemory(
        jnp.zeros(shape, dtype), jnp.zeros(shape, dtype), jnp.zeros((), jnp.int32)
    )


def update_memory(mems: Memory, inputs_LBTD: jax.Array) -> Memory:
    """Keep the last M states of concat(mems, inputs) per layer; no gradient flows back."""
    seg_len = inputs_LBTD.shape[2]
    mem_len = mems.states.shape[2]
    window = jnp.concatenate([mems.states, inputs_LBTD.astype(mems.states.dtype)], axis=2)
    states = jax.lax.stop_gradient(window[:, :, seg_len:])  # drop the oldest T: M remain
    return Memory(states, jnp.minimum(mems.valid + seg_len, mem_len).astype(jnp.int32))


def update_key_value_memory(
    mems: KeyValueMemory, window_keys: jax.Array, window_values: jax.Array
) -> KeyValueMemory:
    """The last M of each layer's window of keys and of values ``[L, B, N, H, M + T]``; no
    gradient."""
    seg_len = window_keys.shape[-1] - mems.length

    def kept(windows, like):
        return jax.lax.stop_gradient(windows[..., seg_len:].astype(like.dtype))

    valid = jnp.minimum(mems.valid + seg_len, mems.length).astype(jnp.int32)
    return KeyValueMemory(kept(window_keys, mems.keys), kept(window_values, mems.values), valid)


def key_validity(mems: AnyMemory, seg_len: int) -> jax.Array:
    """``[M + T]`` bool: which keys of the window (memory slots, then the segment) hold states."""
    mem_len = mems.length
    slot = jnp.arange(mem_len + seg_len)
    return slot >= mem_len - mems.valid


Readout = Callable[[jax.Array, Any], Any]


def logits_of(logits: jax.Array, segment: Any) -> jax.Array:
    """The default readout: keep each segment's logits."""
    return logits


def segment_step(
    model: Any, readout: Readout = logits_of, *, deterministic: bool = True, targets: bool = False
):
    """The one step over segments that evaluation, RECL, probes and generation share:
    ``step(mems, segment) -> (mems, readout(logits, segment))``.

    ``segment`` is the tokens ``[B, T]`` or a dict whose ``"inputs"`` they are (the other entries,
    such as targets, weights or a random key, are for ``readout``); ``readout`` keeps what the caller
    needs of the segment's logits (losses, predictions, a sample), so the logits of a long stream
    never have to be held. With ``targets``, ``readout`` gets ``log p(segment["targets"])``
    ``[B, T]`` instead (``model.target_log_probs``), and ``[B, T, V]`` logits are never built: what
    scoring needs, with an adaptive softmax over a large vocabulary."""

    def step(mems: AnyMemory, segment: Any) -> tuple[AnyMemory, Any]:
        tokens = segment["inputs"] if isinstance(segment, dict) else segment
        if targets:
            scores, mems = model.target_log_probs(
                tokens, segment["targets"], mems, deterministic=deterministic
            )
        else:
            scores, mems = model(tokens, mems, deterministic=deterministic)
        return mems, readout(scores, segment)

    return step


def scan_segments(
    model: Any,
    segments: Any,
    mems: AnyMemory,
    readout: Readout = logits_of,
    *,
    deterministic: bool = True,
    targets: bool = False,
) -> tuple[Any, AnyMemory]:
    """``jax.lax.scan`` of ``segment_step`` over ``segments`` (``[S, B, T]`` tokens, or a dict of
    ``[S, B, T]`` arrays with ``"inputs"``) -> (the readouts stacked ``[S, ...]``, the memory after the
    last segment). With dropout (``deterministic=False``) the model's random state is carried too."""
    if deterministic:
        mems, outs = jax.lax.scan(segment_step(model, readout, targets=targets), mems, segments)
        return outs, mems
    graphdef, state = nnx.split(model)

    def step(carry, segment):
        state, mems = carry
        module = nnx.merge(graphdef, state)
        mems, out = segment_step(module, readout, deterministic=False, targets=targets)(
            mems, segment
        )
        return (nnx.state(module), mems), out

    (state, mems), outs = jax.lax.scan(step, (state, mems), segments)
    nnx.update(model, state)
    return outs, mems


def run_segments(
    model: Any,
    tokens: jax.Array,
    mems: AnyMemory,
    *,
    segment_len: int | None = None,
    deterministic: bool = True,
) -> tuple[jax.Array, AnyMemory]:
    """``scan_segments`` of ``model`` over ``tokens [B, S·T]`` in S segments -> (logits [B, S·T, V], mems).

    ``segment_len`` defaults to the memory length (Transformer-XL trains with segment = memory).
    Equals calling the model segment by segment in a Python loop, compiled once.
    """
    batch, total = tokens.shape
    seg_len = segment_len or mems.length
    if not seg_len or total % seg_len:
        raise ValueError(
            f"run_segments: segment_len={segment_len!r} is invalid for {total} tokens with "
            f"mem_len {mems.length}; pass segment_len=T with T dividing the stream length"
        )
    segments = tokens.reshape(batch, total // seg_len, seg_len).swapaxes(0, 1)  # [S, B, T]
    logits, mems = scan_segments(model, segments, mems, deterministic=deterministic)
    return logits.swapaxes(0, 1).reshape(batch, total, -1), mems
