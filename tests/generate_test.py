"""Generation with the memory as the cache equals recomputing the whole context every step."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from relpos_jax import generate
from relpos_jax.config import POSITIONS
from tests.helpers import tiny_model


def _model(position):
    return tiny_model(position, seed=3, mem_len=4, init_std=0.5)


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
        len(np.unique(np.asarray(generated))) > 2
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


def test_short_memory_gives_a_bounded_context():
    model = _model("txl")
    prompt = jax.random.randint(jax.random.PRNGKey(0), (1, 6), 0, 256)
    bounded = generate(model, prompt, 4, temperature=0.0, mem_len=2)
    assert bounded.shape == (1, 4)


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
