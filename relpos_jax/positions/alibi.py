"""ALiBi: attention with linear biases (Press, Smith & Lewis 2022, arXiv 2108.12409).

No position embeddings at all: each head adds ``−m·|q − k|`` to its logits, with head slopes ``m`` a
geometric sequence that starts at ``2^(−8/n)`` and has that same ratio. For a head count that is not a
power of two the authors take the slopes of the nearest lower power of two, then every other slope of
the sequence for twice that many heads (``get_slopes`` in their fairseq fork).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from relpos_jax.positions import _checks


def _power_of_two_slopes(n: int) -> list[float]:
    start = 2.0 ** (-8.0 / n)
    return [start ** (i + 1) for i in range(n)]


def _slopes(n: int) -> list[float]:
    lower = 2 ** math.floor(math.log2(n))
    if lower == n:
        return _power_of_two_slopes(n)
    return _power_of_two_slopes(lower) + _slopes(2 * lower)[0::2][: n - lower]


def alibi_slopes(num_heads: int) -> jax.Array:
    """``[num_heads]`` slopes, largest first (e.g. 1/2, 1/4, … 1/256 for 8 heads)."""
    _checks.positive_int("alibi_slopes", "num_heads", num_heads)
    return jnp.asarray(_slopes(num_heads), jnp.float32)


def alibi_bias(q_pos: jax.Array, k_pos: jax.Array, slopes: jax.Array) -> jax.Array:
    """``[num_heads, Tq, Tk]`` = −slope·|q − k| (symmetric; mask future keys for a causal model)."""
    _checks.ndim("alibi_bias", "slopes", slopes, 1, "[num_heads]")
    distance = jnp.abs(q_pos[:, None] - k_pos[None, :]).astype(jnp.float32)
    return -slopes[:, None, None] * distance
