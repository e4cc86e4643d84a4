"""Dropout whose random bits XLA fuses into the masked operation.

``nnx.Dropout`` draws its mask with ``jax.random.bernoulli``. On a CPU, JAX lowers the threefry hash
behind it as a rolled loop (``fori_loop`` over its 5 blocks of rounds): every dropout materialises
its 32-bit words, loops over them five times and copies the loop state, about 80 ms of a 450 ms
txl_small bf16 training step. Here the same hash is written out as elementwise operations on the
elements' counters, so XLA fuses hash, comparison and masking into one vectorised loop, with
nothing written but the result (3.6× faster on a [16, 128, 1024] mask).

Each hash gives two 32-bit words, and ``jax.random.bits(key, shape, jnp.uint32)`` keeps only their
exclusive or: half of the work thrown away. A mask here takes both words as two draws
(``random_draws``): a last-axis row of length L uses ⌈L/2⌉ hashes, their first words for its first
half and their second words for the rest. These are exactly the 64-bit ``jax.random.bits(key,
(..., ⌈L/2⌉), jnp.uint64)`` split in two (threefry2x32 keys, the default partitionable counters),
so masks are reproducible and, as the counters follow the leading axes, shard like their input.
A dropout costs about half as much (1M-element bf16 mask, forward and backward: 3.1 → 1.7 ms), and
XLA computes its mask once, as booleans, for the forward and the backward pass.
An element is kept when its draw is at least ``round(rate · 2³²)``, and kept elements are scaled by
the exact ``1 / (1 − rounded rate)``. The module's state (rate, RNG stream) is ``nnx.Dropout``'s own.

All of this is for XLA:CPU: on a GPU or TPU (``backend.on_cpu()`` false) the module draws its mask
with JAX's own ``jax.random.bernoulli``, as ``nnx.Dropout`` does. (The tiled attention's tiles keep
``keep_mask`` everywhere: the Pallas kernels draw the same bits.)
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

from relpos_jax.ops import backend

LEVELS = 1 << 32
_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))


def random_bits(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """``jax.random.bits(key, shape, jnp.uint32)``, computed elementwise so that XLA can fuse it."""
    size = math.prod(shape)
    key, fused = _fused_key(key, size)
    if not fused:
        return jax.random.bits(key, shape, jnp.uint32)
    k1, k2 = jax.random.key_data(key)
    counters = jax.lax.iota(jnp.uint32, size).reshape(shape)
    high, low = _threefry2x32(k1, k2, jnp.zeros_like(counters), counters)
    return high ^ low


def random_draws(key: jax.Array, shape: tuple[int, ...]) -> jax.Array:
    """Uniform 32-bit draws of ``shape``, two per hash (see the module docstring): row ``r`` of the
    last axis is ``concatenate([high(r), low(r)])[:L]``, the words of 64-bit ``jax.random.bits``."""
    return _word_pairs(key, shape, lambda words: words)


def _word_pairs(key: jax.Array, shape: tuple[int, ...], of_words) -> jax.Array:
    """``of_words`` (elementwise) of ``random_draws(key, shape)``, applied to each hash's words
    before they are laid out, so that XLA stores its result (a mask: one byte, not four)."""
    *leading, length = shape or (1,)
    pairs = -(-length // 2)
    key, fused = _fused_key(key, math.prod(leading) * pairs)
    if not fused:
        return of_words(random_bits(key, shape))
    k1, k2 = jax.random.key_data(key)
    counters = jax.lax.iota(jnp.uint32, math.prod(leading) * pairs).reshape(*leading, 1, pairs)
    high, low = _threefry2x32(k1, k2, jnp.zeros_like(counters), counters)
    rows = jnp.concatenate([of_words(high), of_words(low)], axis=-2)
    return rows.reshape(*leading, 2 * pairs)[..., :length].reshape(shape)


def _fused_key(key: jax.Array, counters: int) -> tuple[jax.Array, bool]:
    """``key`` as a typed key, and whether its hash can be written out here: threefry2x32 keys
    (a raw uint32[2] key is one of the default implementation) and fewer than 2³² counters."""
    if not jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
        key = jax.random.wrap_key_data(key)
    return key, str(jax.random.key_impl(key)) == "threefry2x32" and counters < 1 << 32


def _threefry2x32(k1, k2, x1, x2):
    """The Threefry-2x32 hash (20 rounds) of the counter pairs ``(x1, x2)`` under key ``(k1, k2)``."""
    keys = (k1, k2, k1 ^ k2 ^ jnp.uint32(0x1BD11BDA))
    x1, x2 = x1 + keys[0], x2 + keys[1]
    for block in range(5):
        for rotation in _ROTATIONS[block % 2]:
            x1 = x1 + x2
            x2 = ((x2 << jnp.uint32(rotation)) | (x2 >> jnp.uint32(32 - rotation))) ^ x1
        x1 = x1 + keys[(block + 1) % 3]
        x2 = x2 + keys[(block + 2) % 3] + jnp.uint32(block + 1)
    return x1, x2


def keep_mask(key: jax.Array, shape: tuple[int, ...], rate: float) -> tuple[jax.Array, float]:
    """``(mask, scale)``: a boolean keep mask of ``shape`` and the factor for the kept elements."""
    threshold = min(round(rate * LEVELS), LEVELS - 1)
    mask = _word_pairs(key, shape, lambda words: words >= jnp.uint32(threshold))
    return mask, LEVELS / (LEVELS - threshold)


class Dropout(nnx.Dropout):
    """``nnx.Dropout`` with fused random bits (see the module docstring)."""

    def next_key(self, rngs=None) -> jax.Array:
        """The key of the next draw: ``rngs`` (a key, ``nnx.Rngs`` or a stream), else the layer's."""
        stream = self.rngs if rngs is None else rngs
        if isinstance(stream, jax.Array):  # a key
            return stream
        if isinstance(stream, nnx.Rngs):
            return stream[self.rng_collection]()
        return stream()

    def __call__(self, inputs, *, deterministic: bool | None = None, rngs=None) -> jax.Array:
        deterministic = self.deterministic if deterministic is None else deterministic
        if self.rate == 0.0 or deterministic:
            return inputs
        if self.rate >= 1.0:
            return jnp.zeros_like(inputs)
        key = self.next_key(rngs)
        if backend.on_cpu():
            mask, scale = keep_mask(key, inputs.shape, self.rate)
        else:
            mask, scale = (
                jax.random.bernoulli(key, 1.0 - self.rate, inputs.shape),
                1 / (1 - self.rate),
            )
        return jnp.where(mask, inputs * jnp.asarray(scale, inputs.dtype), jnp.zeros_like(inputs))
