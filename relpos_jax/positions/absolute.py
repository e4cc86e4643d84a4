"""Absolute position encodings: the sinusoid of Vaswani et al. 2017 and a learned table.

``sinusoid`` uses the Transformer-XL layout (Dai et al. 2019, ``PositionalEmbedding``): all sines
first, then all cosines, ``concat(sin(p·ω), cos(p·ω))`` with ``ω_i = base^(-2i/dim)``. The same
function gives Transformer-XL's relative encoding ``R`` when fed distances instead of positions.

The learned table (Al-Rfou et al. 2019 / GPT-2 style) is an ``[max_len, dim]`` array owned by the
caller; ``learned_lookup`` clamps positions into the table, so a long evaluation never reads out of
bounds (positions past the table reuse its last row, which is what extrapolating it means).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from relpos_jax.positions import _checks


def sinusoid(positions: jax.Array, dim: int, base: float = 10000.0) -> jax.Array:
    """``[..., dim]`` = concat(sin(p·ω), cos(p·ω)), ω_i = base^(-2i/dim), i < dim/2."""
    _checks.even_int("sinusoid", "dim", dim)
    _checks.positive_float("sinusoid", "base", base)
    # Default float dtype: float32, or float64 under jax.enable_x64 (the reference tests use it).
    inv_freq = 1.0 / (base ** (jnp.arange(0, dim, 2, dtype=float) / dim))
    angles = jnp.asarray(positions, dtype=float)[..., None] * inv_freq
    return jnp.concatenate([jnp.sin(angles), jnp.cos(angles)], axis=-1)


def learned_table_init(key: jax.Array, max_len: int, dim: int, stddev: float = 0.02) -> jax.Array:
    """A ``[max_len, dim]`` table drawn from N(0, stddev²), the usual learned-position init."""
    _checks.positive_int("learned_table_init", "max_len", max_len)
    _checks.positive_int("learned_table_init", "dim", dim)
    return stddev * jax.random.normal(key, (max_len, dim), jnp.float32)


def learned_lookup(table: jax.Array, positions: jax.Array) -> jax.Array:
    """Rows of ``table [max_len, dim]`` at ``positions [...]`` -> ``[..., dim]``, clamped."""
    _checks.ndim("learned_lookup", "table", table, 2, "[max_len, dim]")
    index = jnp.clip(jnp.asarray(positions), 0, table.shape[0] - 1)
    return jnp.take(table, index, axis=0)
