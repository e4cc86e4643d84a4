"""DeBERTa disentangled attention (He et al. 2021, arXiv 2006.03654; DeBERTa-v2 log buckets).

    Ã_ij = Q^c_i·K^c_j  +  Q^c_i·K^r_{δ(i,j)}  +  K^c_j·Q^r_{δ(i,j)}      (content, c2p, p2c)

``K^r`` and ``Q^r`` are projections of one shared table of ``2·bucket_size`` relative embeddings. The
distance is log-bucketed as in DeBERTa-v2 (``make_log_bucket_position``): exact below
``bucket_size / 2``, logarithmic up to ``max_position``. The released code indexes both terms with
``δ = clip(bucket(q − k) + bucket_size, 0, 2·bucket_size − 1)`` (its p2c sign flip cancels the paper's
δ(j, i)); we follow the code so that released checkpoints load with identical scores. The
scale is ``1/√(d·(1 + number of position terms))``, applied by the caller. Nothing here assumes a
bidirectional model, so with a causal mask and memory positions it works as a causal LM.

Legend: B batch, Q/K time (queries, keys), N heads, H head dim, R = 2·bucket_size table rows.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from relpos_jax.positions import _buckets, _checks


def deberta_bucket(rel: jax.Array, bucket_size: int = 256, max_position: int = 512) -> jax.Array:
    """Signed log bucket of ``rel = q − k`` (DeBERTa-v2 ``make_log_bucket_position``)."""
    _checks.even_int("deberta_bucket", "bucket_size", bucket_size)
    mid = bucket_size // 2
    if max_position <= mid + 1:
        _checks.fail(
            "deberta_bucket",
            "max_position",
            max_position,
            f"it must exceed bucket_size/2 + 1 = {mid + 1}",
        )
    rel = jnp.asarray(rel, jnp.int32)
    sign = jnp.sign(rel)
    abs_pos = jnp.where(jnp.abs(rel) < mid, mid - 1, jnp.abs(rel)).astype(jnp.float32)
    log_ratio = jnp.log(abs_pos / mid) / jnp.log(jnp.float32((max_position - 1) / mid))
    log_pos = jnp.ceil(log_ratio * (mid - 1)).astype(jnp.int32) + mid
    return jnp.where(abs_pos <= mid, rel, log_pos * sign)


def deberta_index(
    q_pos: jax.Array, k_pos: jax.Array, bucket_size: int = 256, max_position: int = 512
) -> jax.Array:
    """``[Tq, Tk]`` rows δ(i, j) of the ``[2·bucket_size, ...]`` relative table."""
    bucket = deberta_bucket(q_pos[:, None] - k_pos[None, :], bucket_size, max_position)
    return jnp.clip(bucket + bucket_size, 0, 2 * bucket_size - 1)


def deberta_c2p(q_BQNH: jax.Array, pos_key_RNH: jax.Array, index_QK: jax.Array) -> jax.Array:
    """Content-to-position ``Q^c_i · K^r_{δ(i,j)}`` -> ``[B, N, Tq, Tk]`` (unscaled)."""
    _checks.ndim("deberta_c2p", "q_BQNH", q_BQNH, 4, "[batch, q_len, heads, head_dim]")
    return _buckets.bucket_logits(q_BQNH, pos_key_RNH, index_QK)


def deberta_p2c(k_BKNH: jax.Array, pos_query_RNH: jax.Array, index_QK: jax.Array) -> jax.Array:
    """Position-to-content ``K^c_j · Q^r_{δ(i,j)}`` -> ``[B, N, Tq, Tk]`` (unscaled)."""
    _checks.ndim("deberta_p2c", "k_BKNH", k_BKNH, 4, "[batch, k_len, heads, head_dim]")
    return _buckets.bucket_logits_by_key(k_BKNH, pos_query_RNH, index_QK)


def deberta_scale(head_dim: int, num_position_terms: int = 2) -> float:
    """DeBERTa's logit scale ``1/√(d·(1 + terms))`` (terms = how many of c2p, p2c are used)."""
    _checks.positive_int("deberta_scale", "head_dim", head_dim)
    return 1.0 / math.sqrt(head_dim * (1 + num_position_terms))
