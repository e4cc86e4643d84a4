"""Fused dropout: its bits are jax.random.bits (both 32-bit words of each hash), the rate and the
expectation hold, masks are reproducible and vary with the key."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from relpos_jax.ops.dropout import LEVELS, Dropout, keep_mask, random_bits, random_draws


@pytest.mark.parametrize("shape", [(7,), (3, 5), (2, 3, 129), (1,), (0, 4)])
@pytest.mark.parametrize("seed", [0, 1234567])
def test_bits_are_jax_random_bits(shape, seed):
    """The elementwise hash against JAX's own threefry, bit for bit, for typed and raw keys."""
    key = jax.random.key(seed)
    want = jax.random.bits(key, shape, jnp.uint32)
    np.testing.assert_array_equal(random_bits(key, shape), want)
    np.testing.assert_array_equal(jax.jit(random_bits, static_argnums=1)(key, shape), want)
    np.testing.assert_array_equal(random_bits(jax.random.key_data(key), shape), want)


def test_other_key_implementations_fall_back_to_jax_random_bits():
    key = jax.random.key(5, impl="rbg")
    np.testing.assert_array_equal(
        random_bits(key, (4, 9)), jax.random.bits(key, (4, 9), jnp.uint32)
    )


def _words_of_64_bit_draws(key, shape):
    """The reference: each last-axis row is the high words of ⌈L/2⌉ 64-bit jax.random.bits, then
    their low words, cut to L."""
    *leading, length = shape or (1,)
    with jax.enable_x64(True):
        draws = np.asarray(jax.random.bits(key, (*leading, -(-length // 2)), jnp.uint64))
    rows = np.concatenate([draws >> np.uint64(32), draws & np.uint64(0xFFFFFFFF)], axis=-1)
    return rows[..., :length].astype(np.uint32).reshape(shape)


@pytest.mark.parametrize("shape", [(8,), (7,), (3, 5), (2, 3, 130), (2, 3, 129), (1,), (), (0, 4)])
@pytest.mark.parametrize("seed", [0, 1234567])
def test_draws_are_both_words_of_jax_random_bits(shape, seed):
    key = jax.random.key(seed)
    want = _words_of_64_bit_draws(key, shape)
    np.testing.assert_array_equal(random_draws(key, shape), want)
    np.testing.assert_array_equal(jax.jit(random_draws, static_argnums=1)(key, shape), want)
    np.testing.assert_array_equal(random_draws(jax.random.key_data(key), shape), want)


def test_draws_of_other_key_implementations_are_jax_random_bits():
    key = jax.random.key(5, impl="rbg")
    np.testing.assert_array_equal(
        random_draws(key, (4, 9)), jax.random.bits(key, (4, 9), jnp.uint32)
    )


def test_both_words_are_independent_uniform_draws():
    """The two halves of a row (one hash's two words) are uncorrelated and uniform."""
    draws = np.asarray(random_draws(jax.random.key(7), (4096, 64)), np.float64) / LEVELS
    first, second = draws[:, :32].ravel(), draws[:, 32:].ravel()
    sigma = 1 / np.sqrt(first.size)
    assert abs(np.corrcoef(first, second)[0, 1]) < 5 * sigma
    for half in (first, second):
        assert abs(half.mean() - 0.5) < 5 * sigma * np.sqrt(1 / 12)
        counts = np.histogram(half, bins=16, range=(0, 1))[0]
        expected = half.size / 16
        assert ((counts - expected) ** 2 / expected).sum() < 60  # chi-square, 15 dof: p ≈ 1e-7


def test_mask_is_the_threshold_of_the_draws():
    key, shape = jax.random.key(2), (32, 65)
    mask, _ = keep_mask(key, shape, 0.3)
    np.testing.assert_array_equal(mask, _words_of_64_bit_draws(key, shape) >= round(0.3 * LEVELS))


@pytest.mark.parametrize("rate", [0.1, 0.25, 0.5, 0.9])
def test_keep_fraction_and_mean_match_the_rate(rate):
    shape = (64, 127, 33)
    mask, scale = keep_mask(jax.random.key(0), shape, rate)
    assert mask.shape == shape and mask.dtype == jnp.bool_
    rounded = round(rate * LEVELS) / LEVELS
    assert abs(rounded - rate) <= 0.5 / LEVELS
    kept = float(mask.mean())
    assert abs(kept - (1 - rounded)) < 5 * np.sqrt(rounded * (1 - rounded) / mask.size)  # 5 sigma
    np.testing.assert_allclose(scale * (1 - rounded), 1.0, rtol=1e-12)


def test_module_scales_kept_values_and_is_reproducible():
    x = jnp.ones((8, 1000))
    outputs = []
    for _ in range(2):
        drop = Dropout(0.2, rngs=nnx.Rngs(dropout=3))
        outputs.append(drop(x, deterministic=False))
    np.testing.assert_array_equal(outputs[0], outputs[1])  # same stream state, same mask
    values = np.unique(np.asarray(outputs[0]))
    np.testing.assert_allclose(values, [0.0, LEVELS / (LEVELS - round(0.2 * LEVELS))], rtol=1e-6)
    assert abs(float(outputs[0].mean()) - 1.0) < 0.03
    drop = Dropout(0.2, rngs=nnx.Rngs(dropout=3))
    first, second = drop(x, deterministic=False), drop(x, deterministic=False)
    assert not np.array_equal(first, second)  # the stream advances
    np.testing.assert_array_equal(drop(x, deterministic=True), x)
    np.testing.assert_array_equal(Dropout(0.0, rngs=nnx.Rngs(0))(x, deterministic=False), x)
    assert not np.asarray(Dropout(1.0, rngs=nnx.Rngs(0))(x, deterministic=False)).any()


def test_gradient_flows_through_kept_elements_only():
    drop = Dropout(0.5, rngs=nnx.Rngs(dropout=0))
    x, key = jnp.arange(1.0, 101.0), jax.random.key(1)
    grads = np.asarray(jax.grad(lambda x: drop(x, deterministic=False, rngs=key).sum())(x))
    kept = grads > 0
    np.testing.assert_allclose(grads[kept], LEVELS / (LEVELS - LEVELS // 2), rtol=1e-6)
    assert 20 < kept.sum() < 80
