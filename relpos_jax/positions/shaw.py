"""Relative position representations of Shaw, Uszkoreit & Vaswani 2018 (arXiv 1803.02155).

    e_ij = q_iᵀ (k_j + a^K_ij) / √d          z_i = Σ_j α_ij (v_j + a^V_ij)

with ``a_ij`` a row of a learned table of ``2k + 1`` vectors, picked by the clipped distance. The paper
writes ``w_clip(j − i, k)``; this library's one convention is ``rel = q_pos − k_pos`` (positive: the key
is in the past), so the row is ``shaw_index(rel, k) = clip(rel, −k, k) + k``: row ``k + d`` holds the
vector for a key ``d`` steps back. Distances beyond ``k`` share the end rows (clamped, never out of
bounds). Both sides are computed without a ``[Tq, Tk, H]`` tensor (see ``_buckets``).

Legend: B batch, Q/K time (queries, keys), N heads, H head dim, R = 2k + 1 table rows.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from relpos_jax.positions import _buckets, _checks


def shaw_index(rel: jax.Array, max_distance: int) -> jax.Array:
    """``clip(rel, −k, k) + k``: the row of a ``[2k + 1, ...]`` table for distance ``rel = q − k``."""
    _checks.positive_int("shaw_index", "max_distance", max_distance)
    return jnp.clip(rel, -max_distance, max_distance) + max_distance


def _table_distance(table: jax.Array, func: str) -> int:
    rows = table.shape[0] if table.ndim else 0
    if rows < 3 or rows % 2 == 0:
        _checks.fail(func, "table.shape[0]", rows, "a Shaw table has 2k + 1 rows (k ≥ 1)")
    return (rows - 1) // 2


def shaw_rel_index(q_pos: jax.Array, k_pos: jax.Array, max_distance: int) -> jax.Array:
    """``[Tq, Tk]`` table rows for explicit query and key positions."""
    return shaw_index(q_pos[:, None] - k_pos[None, :], max_distance)


def shaw_key_logits(
    q_BQNH: jax.Array, table_K: jax.Array, q_pos: jax.Array, k_pos: jax.Array
) -> jax.Array:
    """The key-side term ``q_iᵀ a^K_ij`` -> ``[B, N, Tq, Tk]`` (unscaled; add to ``q·k`` then scale)."""
    _checks.ndim("shaw_key_logits", "q_BQNH", q_BQNH, 4, "[batch, q_len, heads, head_dim]")
    index = shaw_rel_index(q_pos, k_pos, _table_distance(table_K, "shaw_key_logits"))
    return _buckets.bucket_logits(q_BQNH, table_K, index)


def shaw_value_output(
    weights_BNQK: jax.Array, table_V: jax.Array, q_pos: jax.Array, k_pos: jax.Array
) -> jax.Array:
    """The value-side term ``Σ_j α_ij a^V_ij`` -> ``[B, Tq, N, H]`` (add to ``Σ_j α_ij v_j``)."""
    _checks.ndim("shaw_value_output", "weights_BNQK", weights_BNQK, 4, "[batch, heads, q, k]")
    index = shaw_rel_index(q_pos, k_pos, _table_distance(table_V, "shaw_value_output"))
    return _buckets.bucket_values(weights_BNQK, table_V, index)
