"""Content-dependent logits and values against a table of relative-position vectors.

Shaw et al. (key and value sides) and DeBERTa (c2p, p2c) both look a vector up in a small table by
the bucket of each (query, key) pair. Looking it up per pair builds a ``[Tq, Tk, H]`` tensor; these
helpers never do. Logits: project every query on every table row once (``[Tq, R]``), then gather by
bucket. Values: scatter the attention weights into their buckets (``[Tq, R]``), then one matmul with
the table. Memory is O((Tq + Tk)·R) beside the ``[Tq, Tk]`` logits themselves.

Legend: B batch, T/Q/K time (queries, keys), N heads, H head dim, R table rows (buckets).
A table is ``[R, N, H]`` (one per head) or ``[R, H]`` (shared by all heads, as in Shaw et al.).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from relpos_jax.positions import _checks


def _per_head(table: jax.Array, func: str, arg: str) -> jax.Array:
    _checks.ndim(func, arg, table, (2, 3), "[rows, heads, head_dim] or [rows, head_dim]")
    return table[:, None, :] if table.ndim == 2 else table


def bucket_logits(x_BTNH: jax.Array, table: jax.Array, index_QK: jax.Array) -> jax.Array:
    """``out[b, n, i, j] = x[b, i, n] · table[index[i, j], n]`` -> ``[B, N, Q, K]`` (x rows = queries)."""
    table_RNH = _per_head(table, "bucket_logits", "table")
    scores_BNQR = jnp.einsum("btnh,rnh->bntr", x_BTNH, table_RNH)
    return jnp.take_along_axis(scores_BNQR, index_QK[None, None], axis=-1, mode="clip")


def bucket_logits_by_key(k_BTNH: jax.Array, table: jax.Array, index_QK: jax.Array) -> jax.Array:
    """``out[b, n, i, j] = k[b, j, n] · table[index[i, j], n]`` -> ``[B, N, Q, K]`` (x rows = keys)."""
    table_RNH = _per_head(table, "bucket_logits_by_key", "table")
    scores_BNRK = jnp.einsum("btnh,rnh->bnrt", k_BTNH, table_RNH)
    return jnp.take_along_axis(scores_BNRK, index_QK[None, None], axis=-2, mode="clip")


def bucket_values(weights_BNQK: jax.Array, table: jax.Array, index_QK: jax.Array) -> jax.Array:
    """``out[b, i, n] = Σ_j weights[b, n, i, j] · table[index[i, j], n]`` -> ``[B, Q, N, H]``."""
    table_RNH = _per_head(table, "bucket_values", "table")
    num_rows = table_RNH.shape[0]
    batch, heads, q_len, _ = weights_BNQK.shape
    rows_QK = jnp.broadcast_to(jnp.arange(q_len)[:, None], index_QK.shape)
    per_bucket_BNQR = jnp.zeros((batch, heads, q_len, num_rows), weights_BNQK.dtype)
    per_bucket_BNQR = per_bucket_BNQR.at[:, :, rows_QK, index_QK].add(weights_BNQK, mode="drop")
    return jnp.einsum("bnqr,rnh->bqnh", per_bucket_BNQR, table_RNH.astype(weights_BNQK.dtype))
