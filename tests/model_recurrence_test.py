"""Segment recurrence is exact, causal and translation invariant, for every position scheme.

Exact recurrence: a stream processed segment by segment with memory equals one pass over the whole
stream with the block-banded mask (a query in a segment starting at s sees keys in [s − M, q]).
"""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from relpos_jax import run_segments
from relpos_jax.config import POSITIONS, RELATIVE_POSITIONS
from tests.helpers import tiny_model

B, T, S, M = 2, 4, 3, 5  # batch, segment, segments, memory (M not a multiple of T on purpose)
TOL = dict(rtol=2e-4, atol=2e-4)


def _model(position, **overrides):
    return tiny_model(position, **{"mem_len": M, **overrides})


def _stream(length=S * T, seed=1):
    return jax.random.randint(jax.random.PRNGKey(seed), (B, length), 0, 256)


def _segment_by_segment(model, tokens, mem_len):
    mems = model.init_mems(B, mem_len)
    outputs = []
    for s in range(tokens.shape[1] // T):
        logits, mems = model(tokens[:, s * T : (s + 1) * T], mems)
        outputs.append(logits)
    return jnp.concatenate(outputs, axis=1), mems


def _block_banded_mask(length, mem_len):
    q = np.arange(length)[:, None]
    k = np.arange(length)[None, :]
    segment_start = (q // T) * T
    return jnp.asarray((k <= q) & (k >= segment_start - mem_len))


@pytest.mark.parametrize("pre_norm", [False, True], ids=["post-norm", "pre-norm"])
@pytest.mark.parametrize("impl", ["dense", "tiled"])
@pytest.mark.parametrize("position", RELATIVE_POSITIONS)
def test_recurrence_equals_block_banded_full_pass(position, impl, pre_norm):
    """Tiled: tiles of 3 keys by 3 queries, dividing neither the segment, the memory nor the
    12-token full pass. Pre-norm: the layer norm of memory and segment together."""
    model = _model(position, attention_impl=impl, key_tile=3, query_tile=3, pre_norm=pre_norm)
    tokens = _stream()
    segmented, _ = _segment_by_segment(model, tokens, M)
    full, _ = model(tokens, model.init_mems(B, 0), attention_mask=_block_banded_mask(S * T, M))
    np.testing.assert_allclose(segmented, full, **TOL)


@pytest.mark.parametrize("position", RELATIVE_POSITIONS)
def test_memory_longer_than_stream_equals_plain_causal_pass(position):
    model = _model(position)
    tokens = _stream()
    segmented, mems = _segment_by_segment(model, tokens, S * T + 3)
    full, _ = model(tokens, model.init_mems(B, 0))
    np.testing.assert_allclose(segmented, full, **TOL)
    assert int(mems.valid) == S * T


@pytest.mark.parametrize("position", POSITIONS)
def test_first_segment_with_empty_memory_equals_no_memory(position):
    model = _model(position)
    tokens = _stream(T)
    with_memory, _ = model(tokens, model.init_mems(B, M))
    without, _ = model(tokens, model.init_mems(B, 0))
    np.testing.assert_allclose(with_memory, without, **TOL)


@pytest.mark.parametrize("position", POSITIONS)
def test_second_segment_depends_on_first_only_through_memory(position):
    model = _model(position)
    first_a, first_b, second = _stream(T, 1), _stream(T, 2), _stream(T, 3)

    def second_logits(first, mem_len):
        _, mems = model(first, model.init_mems(B, mem_len))
        return model(second, mems)[0]

    assert float(jnp.abs(second_logits(first_a, M) - second_logits(first_b, M)).max()) > 1e-3
    np.testing.assert_array_equal(second_logits(first_a, 0), second_logits(first_b, 0))


@nnx.jit
def _gradients_by_position(model, x, mems):
    """``[T, B, T, D]``: row t is the gradient of the logits at t (summed) with respect to ``x``."""
    return jax.jacrev(lambda x: model.forward_embeddings(x, mems)[0].sum(axis=(0, 2)))(x)


@pytest.mark.parametrize("position", POSITIONS)
def test_causality_through_gradients(position):
    """The logit at t has zero gradient with respect to the embeddings of tokens after t."""
    model = _model(position)
    _, mems = model(_stream(T, 5), model.init_mems(B, M))  # a memory that holds real states
    x = jax.random.normal(jax.random.PRNGKey(0), (B, T, 32))
    gradients = _gradients_by_position(model, x, mems)
    for t, grad in enumerate(gradients):
        assert float(jnp.abs(grad[:, : t + 1]).sum()) > 0, (position, t)
        np.testing.assert_array_equal(grad[:, t + 1 :], 0.0, err_msg=f"{position}: t={t}")


@pytest.mark.parametrize("position", RELATIVE_POSITIONS)
def test_translation_invariance(position):
    model = _model(position)
    tokens = _stream(T)
    _, mems = model(_stream(T, 5), model.init_mems(B, M))
    base, _ = model(tokens, mems)
    for shift in (1, 37, 1000):
        shifted, _ = model(tokens, mems, position_offset=shift)
        np.testing.assert_allclose(shifted, base, **TOL)


@pytest.mark.parametrize("position", ["txl", "rope", "learned"])
def test_run_segments_equals_python_loop(position):
    model = _model(position)
    tokens = _stream()
    looped, loop_mems = _segment_by_segment(model, tokens, M)
    scanned, scan_mems = run_segments(model, tokens, model.init_mems(B, M), segment_len=T)
    np.testing.assert_allclose(scanned, looped, **TOL)
    np.testing.assert_allclose(scan_mems.states, loop_mems.states, **TOL)
    assert int(scan_mems.valid) == int(loop_mems.valid) == M


def test_same_length_mask_sees_mem_len_plus_one_keys():
    model = _model("txl", same_length=True)
    _, mems = model(_stream(T), model.init_mems(B, M))
    _, mems = model(_stream(T, 2), mems)  # memory full
    weights = model.attention_probabilities(_stream(T, 3), mems, layer=1)  # [B, N, T, M + T]
    np.testing.assert_array_equal((weights > 0).sum(-1), M + 1)


def test_memory_update_keeps_the_latest_states_in_order():
    model = _model("none")
    mems = model.init_mems(B, M)
    x1 = jax.random.normal(jax.random.PRNGKey(1), (B, T, 32))
    x2 = jax.random.normal(jax.random.PRNGKey(2), (B, T, 32))
    _, mems = model.forward_embeddings(x1, mems)
    assert int(mems.valid) == T
    np.testing.assert_array_equal(mems.states[0, :, M - T :], x1)  # layer 0 stores its input
    _, mems = model.forward_embeddings(x2, mems)
    assert int(mems.valid) == M
    np.testing.assert_array_equal(mems.states[0], jnp.concatenate([x1, x2], 1)[:, -M:])


def test_memory_blocks_gradients_across_segments():
    model = _model("txl")
    x1 = jax.random.normal(jax.random.PRNGKey(1), (B, T, 32))
    tokens = _stream(T)

    def loss(x1):
        _, mems = model.forward_embeddings(x1, model.init_mems(B, M))
        return model(tokens, mems)[0].sum()

    np.testing.assert_array_equal(jax.jit(jax.grad(loss))(x1), 0.0)


def test_model_step_compiles_once_per_shape():
    model = _model("txl")
    graphdef, state = nnx.split(model)

    @jax.jit
    @chex.assert_max_traces(n=1)
    def step(state, tokens, mems):
        return nnx.merge(graphdef, state)(tokens, mems)

    mems = model.init_mems(B, M)
    for s in range(4):  # the memory fills up: valid counts change, shapes do not
        _, mems = step(state, _stream(T, s), mems)
