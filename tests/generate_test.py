"""Generation with the memory as the cache equals recomputing the context it holds, every step:
the whole context with the default memory, the last ``mem_len`` tokens with a shorter one."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from relpos_jax import generate
from relpos_jax.config import POSITIONS, RELATIVE_POSITIONS
from tests.helpers import tiny_model


def _model(position):
    return tiny_model(position, seed=3, mem_len=4, init_std=0.5)


@nnx.jit
def _greedy_by_recomputing(model, prompt, generated):
    """What greedy recomputation of the full context picks at each step. The model is causal (tested
    through gradients), so one pass over prompt + generated gives every step's full-context logits."""
    sequence = jnp.concatenate([prompt, generated], axis=1)
    logits, _ = model(sequence, model.init_mems(prompt.shape[0], 0))
    return jnp.argmax(logits[:, prompt.shape[1] - 1 : -1], axis=-1)


@pytest.mark.parametrize("position", POSITIONS)
def test_greedy_generation_equals_recomputing_the_context(position):
    model = _model(position)
    prompt = jax.random.randint(jax.random.PRNGKey(0), (2, 5), 0, 256)
    generated = generate(model, prompt, 8, temperature=0.0)
    np.testing.assert_array_equal(generated, _greedy_by_recomputing(model, prompt, generated))
    assert (
        len(np.unique(np.asarray(generated))) > 1
    )  # a meaningful sequence, not one repeated token


def test_sampling_respects_top_k_and_rng():
    model = _model("txl")
    prompt = jnp.array([[1, 2, 3]])
    greedy = generate(model, prompt, 6, temperature=0.0)
    np.testing.assert_array_equal(
        generate(model, prompt, 6, top_k=1, rng=jax.random.PRNGKey(7)), greedy
    )
    a = generate(model, prompt, 6, temperature=1.0, rng=jax.random.PRNGKey(1))
    np.testing.assert_array_equal(
        a, generate(model, prompt, 6, temperature=1.0, rng=jax.random.PRNGKey(1))
    )
    many = [
        generate(model, prompt, 6, temperature=2.0, rng=jax.random.PRNGKey(s)) for s in range(4)
    ]
    assert len({tuple(np.asarray(m).ravel()) for m in many}) > 1


# Bounded memory: the prompt goes in as one segment, then each step feeds one token with a memory of
# mem_len slots per layer. Two regimes: the prompt overflows the memory (the first token sees the
# whole prompt, the memory keeps its last mem_len tokens), and the memory fills during generation.
BOUNDED = [(7, 3), (2, 4)]  # (prompt length, mem_len)
BOUNDED_IDS = ["prompt_longer_than_memory", "memory_fills_while_generating"]
N_NEW = 10
ABSOLUTE_POSITIONS = [p for p in POSITIONS if p not in RELATIVE_POSITIONS]


@functools.partial(jax.jit, static_argnames="graphdef")
def _last_token_greedy(graphdef, state, tokens, mems):
    """The greedy pick after ``tokens`` given ``mems``, and the new memory (one compile a shape)."""
    logits, mems = nnx.merge(graphdef, state)(tokens, mems)
    return jnp.argmax(logits[:, -1], axis=-1), mems


@nnx.jit
def _greedy_under_mask(model, stream, mask):
    """Every position's greedy pick in one pass over ``stream`` where query i sees the keys
    ``mask[i]`` allows (a traced mask: one compile for every memory length)."""
    logits, _ = model(stream, model.init_mems(stream.shape[0], 0), attention_mask=mask)
    return jnp.argmax(logits, axis=-1)


def _greedy_from_bounded_contexts(model, prompt, generated, mem_len):
    """Token by token, what the model picks when given exactly the context a memory of ``mem_len``
    slots holds: the whole prompt for the first token (it is one segment), then the fed token and
    the ``mem_len`` tokens before it. Teacher-forced on ``generated``, so each step is checked on
    its own. One layer and a relative scheme: a query sees nothing but its allowed keys and their
    distances, so one pass over the stream with each query's context as its mask row is the model
    run from scratch on each context (block-banded masks equal recomputation:
    model_recurrence_test)."""
    prompt_len = prompt.shape[1]
    stream = jnp.concatenate([prompt, generated], axis=1)
    query, key = np.arange(stream.shape[1])[:, None], np.arange(stream.shape[1])[None, :]
    start = np.where(query < prompt_len, 0, np.maximum(query - mem_len, 0))
    mask = jnp.asarray((key <= query) & (key >= start))
    return _greedy_under_mask(model, stream, mask)[:, prompt_len - 1 : -1]


def _greedy_with_hidden_state_memory(model, prompt, n, mem_len):
    """The definition: the prompt as one segment, then one token at a time, with a ``Memory`` of
    hidden states of ``mem_len`` slots (each step projects the memory again with the same weights)."""
    graphdef, state = nnx.split(model)
    token, mems = _last_token_greedy(
        graphdef, state, prompt, model.init_mems(prompt.shape[0], mem_len)
    )
    picks = [token]
    for _ in range(n - 1):
        token, mems = _last_token_greedy(graphdef, state, token[:, None], mems)
        picks.append(token)
    return jnp.stack(picks, axis=1)


@pytest.mark.slow
@pytest.mark.parametrize(("prompt_len", "mem_len"), BOUNDED, ids=BOUNDED_IDS)
@pytest.mark.parametrize("position", RELATIVE_POSITIONS)
def test_short_memory_generation_equals_recomputing_the_context_the_memory_holds(
    position, prompt_len, mem_len
):
    """One layer: a slot of its memory is a projection of one token alone, so greedy generation with
    ``mem_len`` slots is exactly the model run from scratch on the last ``mem_len`` + 1 tokens, for
    every relative scheme (scores see only distances; absolute schemes keep the positions a key had
    when it was written, and are checked against the hidden-state memory below)."""
    model = tiny_model(position, seed=3, n_layers=1, init_std=0.5)
    prompt = jax.random.randint(jax.random.PRNGKey(0), (2, prompt_len), 0, 256)
    generated = generate(model, prompt, N_NEW, temperature=0.0, mem_len=mem_len)
    expected = _greedy_from_bounded_contexts(model, prompt, generated, mem_len)
    np.testing.assert_array_equal(generated, expected)
    # The check tells the memory's length to the slot: one slot fewer or more picks otherwise.
    for other in (mem_len - 1, mem_len + 1):
        assert not np.array_equal(
            generated, _greedy_from_bounded_contexts(model, prompt, generated, other)
        ), f"mem_len {other} picks the same tokens as {mem_len}"


@pytest.mark.slow
@pytest.mark.parametrize(("prompt_len", "mem_len"), BOUNDED, ids=BOUNDED_IDS)
@pytest.mark.parametrize("position", ["txl", *ABSOLUTE_POSITIONS])
def test_short_memory_generation_equals_the_hidden_state_memory_token_by_token(
    position, prompt_len, mem_len
):
    """Two layers: a slot holds a hidden state that itself saw older context, so the definition is
    the model run token by token with a ``Memory`` of hidden states of the same length. Transformer-XL
    and the absolute schemes, which the one-layer test cannot hold to a recomputation (that the two
    memories agree for every scheme is key_value_memory_test's)."""
    model = tiny_model(position, seed=3, init_std=0.5)
    prompt = jax.random.randint(jax.random.PRNGKey(0), (2, prompt_len), 0, 256)
    generated = generate(model, prompt, N_NEW, temperature=0.0, mem_len=mem_len)
    expected = _greedy_with_hidden_state_memory(model, prompt, N_NEW, mem_len)
    np.testing.assert_array_equal(generated, expected)
    assert not np.array_equal(  # and a memory one slot longer would have generated otherwise
        generated, _greedy_with_hidden_state_memory(model, prompt, N_NEW, mem_len + 1)
    )


@pytest.mark.parametrize(
    ("kwargs", "names"),
    [
        (dict(n=0), "n=0"),
        (dict(n=3, temperature=-1.0), "temperature=-1.0"),
        (dict(n=3, top_k=0), "top_k=0"),
    ],
)
def test_bad_arguments(kwargs, names):
    with pytest.raises(ValueError, match=names):
        generate(_model("none"), jnp.array([[1, 2]]), **kwargs)
