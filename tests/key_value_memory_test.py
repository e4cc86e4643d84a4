"""A memory of projected keys and values equals the memory of hidden states, for every scheme.

``model.init_mems(B, M, keys_values=True)`` keeps each layer's keys and values instead of its hidden
states, so that evaluation and generation project only the segment's rows. Where the weights do not
change between segments the two memories must give the same logits, segment after segment (to float32
rounding: only the shapes of the projection products differ), with the memory filling up, longer or
shorter than the segment, pre-norm, same_length, RoPE scaling; any slot or position out of place
would move the logits by O(1) at these parameter scales.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from relpos_jax import run_segments
from relpos_jax.config import POSITIONS
from relpos_jax.memory import KeyValueMemory
from tests.helpers import tiny_model

B = 2
TOL = dict(rtol=1e-5, atol=1e-5)


def _stream(length, seed=1):
    return jax.random.randint(jax.random.PRNGKey(seed), (B, length), 0, 256)


def _segment_by_segment(model, tokens, seg_len, mems):
    outputs = []
    for s in range(tokens.shape[1] // seg_len):
        logits, mems = model(tokens[:, s * seg_len : (s + 1) * seg_len], mems)
        outputs.append(logits)
    return jnp.concatenate(outputs, axis=1), mems


def _both(model, tokens, seg_len, mem_len):
    states = _segment_by_segment(model, tokens, seg_len, model.init_mems(B, mem_len))
    cached = _segment_by_segment(
        model, tokens, seg_len, model.init_mems(B, mem_len, keys_values=True)
    )
    return states, cached


@pytest.mark.parametrize("position", POSITIONS)
@pytest.mark.parametrize("seg_len,mem_len", [(3, 5), (5, 3), (3, 0)])
def test_key_value_memory_equals_hidden_state_memory(position, seg_len, mem_len):
    model = tiny_model(position, mem_len=mem_len)
    tokens = _stream(4 * seg_len)
    (logits, mems), (cached_logits, cached_mems) = _both(model, tokens, seg_len, mem_len)
    np.testing.assert_allclose(cached_logits, logits, **TOL)
    assert isinstance(cached_mems, KeyValueMemory)
    assert int(cached_mems.valid) == int(mems.valid) == min(4 * seg_len, mem_len)


@pytest.mark.parametrize(
    "overrides",
    [
        dict(position="txl", pre_norm=True),
        dict(position="rope", pre_norm=True, rope_fraction=0.5),
        dict(position="txl", same_length=True, clamp_len=4),
        dict(
            position="rope",
            rope_scaling={
                "rope_type": "dynamic",
                "factor": 2.0,
                "original_max_position_embeddings": 4,
            },
        ),
        dict(position="rope", rope_interleaved=True),
        dict(position="deberta", pre_norm=True),
    ],
    ids=[
        "txl-pre_norm",
        "rope-pre_norm-partial",
        "txl-same_length-clamp",
        "rope-dynamic_ntk",
        "rope-interleaved",
        "deberta-pre_norm",
    ],
)
def test_key_value_memory_equals_hidden_state_memory_variants(overrides):
    model = tiny_model(**overrides)
    (logits, _), (cached_logits, _) = _both(model, _stream(12), 3, 5)
    np.testing.assert_allclose(cached_logits, logits, **TOL)


def test_key_value_memory_holds_each_slots_keys_and_values():
    """The memory's slots are the keys and values the layer gave those rows as the segment."""
    model = tiny_model("none", mem_len=5)
    x1, x2 = (jax.random.normal(jax.random.PRNGKey(s), (B, 3, 32)) for s in (1, 2))
    _, mems = model.forward_embeddings(x1, model.init_mems(B, keys_values=True))
    _, mems = model.forward_embeddings(x2, mems)
    w_kv = model.layer(0).attention.w_kv[...]
    layer0 = jnp.einsum("btd,dsnh->sbnht", jnp.concatenate([x1, x2], 1), w_kv)  # inputs of layer 0
    np.testing.assert_allclose(mems.keys[0], layer0[0, ..., -5:], **TOL)
    np.testing.assert_allclose(mems.values[0], layer0[1, ..., -5:], **TOL)
    assert int(mems.valid) == 5


def test_run_segments_and_bf16_with_key_value_memory():
    model = tiny_model("txl", dtype="bfloat16", mem_len=4)
    tokens = _stream(12)
    scanned, mems = run_segments(model, tokens, model.init_mems(B, keys_values=True), segment_len=3)
    looped, _ = _segment_by_segment(model, tokens, 3, model.init_mems(B))
    assert mems.keys.dtype == mems.values.dtype == jnp.bfloat16
    np.testing.assert_allclose(scanned, looped, rtol=0.05, atol=0.05)


def test_a_key_value_memory_of_another_shape_or_in_training_is_refused():
    model = tiny_model("txl")
    mems = model.init_mems(B + 1, keys_values=True)
    with pytest.raises(ValueError, match=r"mems\.keys\.shape=.*keys_values=True"):
        model(_stream(3), mems)
    with pytest.raises(ValueError, match="KeyValueMemory"):
        model.attention_probabilities(_stream(3), model.init_mems(B, keys_values=True))
    with pytest.raises(ValueError, match=r"KeyValueMemory.*train with model\.init_mems"):
        model(_stream(3), model.init_mems(B, keys_values=True), deterministic=False)
