"""Transformer-XL and Shaw attention layers against float64 loops from the papers' formulas.

Transformer-XL (Dai et al. 2019, eq. in section 3.3), all four terms one pair at a time:
    A_ij = q_iᵀk_j + q_iᵀW_R R_{i−j} + uᵀk_j + vᵀW_R R_{i−j},   scaled by 1/√d_head.
Shaw et al. 2018, eqs. (3)–(4): e_ij = q_iᵀ(k_j + a^K_ij)/√d,  z_i = Σ_j α_ij (v_j + a^V_ij).
With memory (Tq != Tk), clamp_len, same_length, and memory slots not yet written.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from relpos_jax import positions as P
from relpos_jax.attention import Attention, PositionContext
from relpos_jax.config import ModelConfig
from tests import reference as ref

D, N, H = 8, 2, 4


def _layer(position, params, **overrides):
    """An attention layer of ``position`` whose parameters are the given float64 arrays."""
    cfg = ModelConfig(position=position, d_model=D, n_heads=N, d_ff=16, **overrides)
    attention = Attention(cfg, rngs=nnx.Rngs(0))
    for name, value in params.items():  # the projections; the scheme's own under position
        owner = attention if name in ("w_q", "w_kv", "w_o") else attention.position
        getattr(owner, name).set_value(jnp.asarray(value))
    return attention


def _mask(q_len, mem_len, valid, same_length):
    def allowed(i, j):
        distance = mem_len + i - j
        return distance >= 0 and j >= mem_len - valid and (not same_length or distance <= mem_len)

    return allowed


CASES = [  # (q_len, mem_len, valid slots, same_length)
    (4, 0, 0, False),
    (3, 5, 5, False),
    (3, 5, 2, False),
    (4, 4, 4, True),
    (2, 6, 6, True),
]


@pytest.mark.parametrize(("q_len", "mem_len", "valid", "same_length"), CASES)
@pytest.mark.parametrize("clamp_len", [None, 3])
def test_txl_attention_matches_the_four_term_formula(
    x64, rng, q_len, mem_len, valid, same_length, clamp_len
):
    w_q = rng.normal(size=(D, N, H))
    w_kv = rng.normal(size=(D, 2, N, H))
    w_o = rng.normal(size=(N, H, D))
    w_r = rng.normal(size=(D, N, H))
    u, v = rng.normal(size=(N, H)), rng.normal(size=(N, H))
    params = {"w_q": w_q, "w_kv": w_kv, "w_o": w_o, "w_r": w_r, "u": u, "v": v}
    attention = _layer(
        "txl", params, txl={"untie_r": True}, clamp_len=clamp_len, same_length=same_length
    )
    x = rng.normal(size=(2, q_len, D))
    mem = rng.normal(size=(2, mem_len, D))

    def score(b, n, i, j, q_i, k_j):
        distance = mem_len + i - j
        if distance < 0:
            return 0.0
        if clamp_len is not None:
            distance = min(distance, clamp_len)
        r = ref.sinusoid(distance, D) @ w_r[:, n]
        a, b_, c, d = q_i @ k_j, q_i @ r, u[n] @ k_j, v[n] @ r  # (a) (b) (c) (d) of the paper
        return (a + b_ + c + d) / math.sqrt(H)

    allowed = _mask(q_len, mem_len, valid, same_length)
    want = ref.attention_layer(
        x, mem, w_q, w_kv[:, 0], w_kv[:, 1], w_o, score, lambda n, i, j: 0.0, allowed
    )

    mask = np.array([[allowed(i, j) for j in range(q_len + mem_len)] for i in range(q_len)])
    k_pos = jnp.arange(q_len + mem_len)
    ctx = PositionContext(
        q_pos=k_pos[mem_len:],
        k_pos=k_pos,
        mask=jnp.asarray(mask),
        scheme={"r_KD": P.relative_sinusoid(q_len + mem_len, D, clamp_len)},
    )
    window = jnp.concatenate([jnp.asarray(mem), jnp.asarray(x)], axis=1)
    got = attention(jnp.asarray(x), window, ctx, deterministic=True)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize(("q_len", "mem_len", "valid", "same_length"), CASES)
def test_shaw_attention_matches_key_and_value_formula(x64, rng, q_len, mem_len, valid, same_length):
    k = 2
    w_q, w_kv, w_o = (
        rng.normal(size=(D, N, H)),
        rng.normal(size=(D, 2, N, H)),
        rng.normal(size=(N, H, D)),
    )
    a_k, a_v = rng.normal(size=(2 * k + 1, H)), rng.normal(size=(2 * k + 1, H))
    params = {"w_q": w_q, "w_kv": w_kv, "w_o": w_o, "table_k": a_k, "table_v": a_v}
    attention = _layer("shaw", params, shaw={"max_distance": k})
    x = rng.normal(size=(2, q_len, D))
    mem = rng.normal(size=(2, mem_len, D))

    def clip_row(i, j):  # w_clip(j − i, k) with query i at window position mem_len + i
        return min(max(j - (mem_len + i), -k), k)

    def score(b, n, i, j, q_i, k_j):
        return q_i @ (k_j + a_k[k - clip_row(i, j)]) / math.sqrt(H)  # row k + (i − j) = k − (j − i)

    def value(n, i, j):
        return a_v[k - clip_row(i, j)]

    allowed = _mask(q_len, mem_len, valid, same_length)
    want = ref.attention_layer(x, mem, w_q, w_kv[:, 0], w_kv[:, 1], w_o, score, value, allowed)
    mask = np.array([[allowed(i, j) for j in range(q_len + mem_len)] for i in range(q_len)])
    k_pos = jnp.arange(q_len + mem_len) + 17  # any origin: only differences matter
    ctx = PositionContext(q_pos=k_pos[mem_len:], k_pos=k_pos, mask=jnp.asarray(mask))
    window = jnp.concatenate([jnp.asarray(mem), jnp.asarray(x)], axis=1)
    got = attention(jnp.asarray(x), window, ctx, deterministic=True)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)
