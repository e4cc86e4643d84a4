"""T5 relative attention bias (Raffel et al. 2020, section 2.1; ``_relative_position_bucket``).

Each head learns one scalar per bucket of distance. Half the buckets are exact small distances, the
rest grow logarithmically up to ``max_distance``, beyond which everything shares the last bucket.
Bidirectional models spend half the buckets on keys in the future. T5's code is called with
``key − query``; here ``rel = q_pos − k_pos``, so ``t5_bucket(rel) == T5(−rel)`` exactly (including
its float32 rounding at the log-bucket edges).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from relpos_jax.positions import _checks


def t5_bucket(
    rel: jax.Array, *, bidirectional: bool, num_buckets: int = 32, max_distance: int = 128
) -> jax.Array:
    """Integer bucket in ``[0, num_buckets)`` of distance ``rel = q − k``."""
    _checks.positive_int("t5_bucket", "num_buckets", num_buckets)
    _checks.positive_int("t5_bucket", "max_distance", max_distance)
    rel = jnp.asarray(rel, jnp.int32)
    bucket = jnp.zeros_like(rel)
    if bidirectional:
        if num_buckets < 4 or num_buckets % 2:
            _checks.fail(
                "t5_bucket", "num_buckets", num_buckets, "bidirectional needs an even count ≥ 4"
            )
        num_buckets //= 2
        bucket = jnp.where(rel < 0, num_buckets, 0)  # keys in the future use the upper half
        distance = jnp.abs(rel)
    else:
        if num_buckets < 2:
            _checks.fail("t5_bucket", "num_buckets", num_buckets, "pass at least 2 buckets")
        distance = jnp.maximum(rel, 0)
    max_exact = num_buckets // 2
    if max_distance <= max_exact:
        _checks.fail(
            "t5_bucket",
            "max_distance",
            max_distance,
            f"it must exceed the {max_exact} exact buckets",
        )
    safe = jnp.maximum(distance, 1).astype(jnp.float32)  # log(0) never reaches the output
    log_ratio = jnp.log(safe / max_exact) / math.log(max_distance / max_exact)
    large = max_exact + (log_ratio * (num_buckets - max_exact)).astype(jnp.int32)
    large = jnp.minimum(large, num_buckets - 1)
    return bucket + jnp.where(distance < max_exact, distance, large)


def t5_bias(
    q_pos: jax.Array,
    k_pos: jax.Array,
    table_RN: jax.Array,
    *,
    bidirectional: bool,
    max_distance: int = 128,
) -> jax.Array:
    """``[num_heads, Tq, Tk]`` bias from a learned ``[num_buckets, num_heads]`` table."""
    _checks.ndim("t5_bias", "table_RN", table_RN, 2, "[num_buckets, num_heads]")
    rel = q_pos[:, None] - k_pos[None, :]
    bucket = t5_bucket(
        rel, bidirectional=bidirectional, num_buckets=table_RN.shape[0], max_distance=max_distance
    )
    return jnp.moveaxis(jnp.take(table_RN, bucket, axis=0), -1, 0)
