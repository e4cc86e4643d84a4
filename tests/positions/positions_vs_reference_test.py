"""Every fast position form against its naive float64 loop (tests/reference.py).

Random inputs, ``Tq != Tk`` (memory before the segment), several lengths, float64 throughout.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import jax.test_util
import numpy as np
import pytest

from relpos_jax import positions as P
from tests import reference as ref

# (q_len, mem_len): a plain segment, a segment with memory, memory longer than the segment.
SHAPES = [(1, 0), (4, 0), (5, 3), (3, 7), (6, 6)]
TOL = dict(rtol=1e-10, atol=1e-10)


def _mask(ref_out):
    return ~np.isnan(ref_out)


@pytest.mark.parametrize("dim", [2, 8, 10])
def test_sinusoid(x64, dim):
    positions = np.array([0, 1, 2, 7, 100, 4095])
    want = np.stack([ref.sinusoid(p, dim) for p in positions])
    np.testing.assert_allclose(P.sinusoid(jnp.asarray(positions), dim), want, **TOL)


@pytest.mark.parametrize(("q_len", "mem_len"), SHAPES)
def test_rel_shift(x64, rng, q_len, mem_len):
    x = rng.normal(size=(2, 3, q_len, q_len + mem_len))
    want = ref.rel_shift(x)
    got = np.asarray(P.rel_shift(jnp.asarray(x)))
    np.testing.assert_array_equal(got[_mask(want)], want[_mask(want)])


def _paper_rel_shift(x):
    """The paper's pad-reshape-slice (kimiyoung/transformer-xl ``_rel_shift``), zero outside the
    causal part (where the paper leaves values of neighbouring rows)."""
    *lead, q_len, k_len = x.shape
    padded = jnp.pad(x, [(0, 0)] * len(lead) + [(0, 0), (1, 0)])
    shifted = padded.reshape(*lead, k_len + 1, q_len)[..., 1:, :].reshape(x.shape)
    causal = np.arange(k_len) <= np.arange(q_len)[:, None] + (k_len - q_len)
    return jnp.where(causal, shifted, 0.0)


@pytest.mark.parametrize(
    "shape", [(2, 3, 5, 8), (4, 4), (5, 3), (1, 1), (3, 6, 1), (2, 7, 12), (2, 1, 7), (3, 1)]
)
def test_rel_shift_is_the_papers_shift_with_its_exact_gradient(x64, rng, shape):
    """Every entry (zeros outside the causal part), and the custom VJP equals autodiff of the
    masked pad-reshape-slice for any cotangent, not only a masked one; Tk < Tq and Tk = 1
    included."""
    x, cotangent = jnp.asarray(rng.normal(size=shape)), jnp.asarray(rng.normal(size=shape))
    np.testing.assert_array_equal(P.rel_shift(x), _paper_rel_shift(x))
    np.testing.assert_array_equal(jax.jit(P.rel_shift)(x), _paper_rel_shift(x))
    got = jax.vjp(P.rel_shift, x)[1](cotangent)[0]
    want = jax.vjp(_paper_rel_shift, x)[1](cotangent)[0]
    np.testing.assert_array_equal(got, want)
    jax.test_util.check_grads(P.rel_shift, (x,), order=2, modes=("rev",))


@pytest.mark.parametrize(("q_len", "mem_len"), SHAPES)
@pytest.mark.parametrize("clamp_len", [None, 2])
def test_txl_position_term(x64, rng, q_len, mem_len, clamp_len):
    batch, heads, head_dim, d_model = 2, 3, 4, 6
    k_len = q_len + mem_len
    q = rng.normal(size=(batch, q_len, heads, head_dim))
    w_r = rng.normal(size=(d_model, heads, head_dim))
    v = rng.normal(size=(heads, head_dim))
    want = ref.txl_position_term(q, w_r, v, k_len, clamp_len)
    r = jnp.einsum("kd,dnh->knh", P.relative_sinusoid(k_len, d_model, clamp_len), w_r)
    got = np.asarray(P.txl_position_logits(jnp.asarray(q), r, jnp.asarray(v)))
    np.testing.assert_allclose(got[_mask(want)], want[_mask(want)], **TOL)


def _positions(q_len, mem_len, offset=0):
    k_pos = np.arange(q_len + mem_len) + offset
    return k_pos[mem_len:], k_pos


@pytest.mark.parametrize(("q_len", "mem_len"), SHAPES)
@pytest.mark.parametrize("shared_table", [True, False])
def test_shaw_key_logits(x64, rng, q_len, mem_len, shared_table):
    heads, head_dim, k = 2, 4, 3
    q = rng.normal(size=(2, q_len, heads, head_dim))
    table = rng.normal(size=(2 * k + 1, head_dim) if shared_table else (2 * k + 1, heads, head_dim))
    q_pos, k_pos = _positions(q_len, mem_len, offset=5)
    want = ref.shaw_key_logits(q, table, q_pos, k_pos)
    got = P.shaw_key_logits(
        jnp.asarray(q), jnp.asarray(table), jnp.asarray(q_pos), jnp.asarray(k_pos)
    )
    np.testing.assert_allclose(got, want, **TOL)


@pytest.mark.parametrize(("q_len", "mem_len"), SHAPES)
@pytest.mark.parametrize("shared_table", [True, False])
def test_shaw_value_output(x64, rng, q_len, mem_len, shared_table):
    heads, head_dim, k = 2, 4, 2
    weights = rng.random(size=(2, heads, q_len, q_len + mem_len))
    table = rng.normal(size=(2 * k + 1, head_dim) if shared_table else (2 * k + 1, heads, head_dim))
    q_pos, k_pos = _positions(q_len, mem_len)
    want = ref.shaw_value_output(weights, table, q_pos, k_pos)
    got = P.shaw_value_output(
        jnp.asarray(weights), jnp.asarray(table), jnp.asarray(q_pos), jnp.asarray(k_pos)
    )
    np.testing.assert_allclose(got, want, **TOL)


def test_shaw_arbitrary_positions(x64, rng):
    """Positions need not be contiguous: any q_pos, k_pos, including keys after queries."""
    q_pos, k_pos = np.array([3, 9, 10, 40]), np.array([0, 2, 9, 11, 12, 50, 41])
    q = rng.normal(size=(1, 4, 2, 3))
    table = rng.normal(size=(9, 2, 3))
    want = ref.shaw_key_logits(q, table, q_pos, k_pos)
    got = P.shaw_key_logits(
        jnp.asarray(q), jnp.asarray(table), jnp.asarray(q_pos), jnp.asarray(k_pos)
    )
    np.testing.assert_allclose(got, want, **TOL)


@pytest.mark.parametrize(("q_len", "mem_len"), SHAPES)
@pytest.mark.parametrize("bidirectional", [True, False])
def test_t5_bias(x64, rng, q_len, mem_len, bidirectional):
    num_buckets, heads = 8, 3
    table = rng.normal(size=(num_buckets, heads))
    q_pos, k_pos = _positions(q_len, mem_len)
    got = np.asarray(
        P.t5_bias(
            jnp.asarray(q_pos),
            jnp.asarray(k_pos),
            jnp.asarray(table),
            bidirectional=bidirectional,
            max_distance=6,
        )
    )
    for i, qp in enumerate(q_pos):
        for j, kp in enumerate(k_pos):
            bucket = int(
                P.t5_bucket(
                    qp - kp, bidirectional=bidirectional, num_buckets=num_buckets, max_distance=6
                )
            )
            np.testing.assert_array_equal(got[:, i, j], table[bucket])


@pytest.mark.parametrize(("q_len", "mem_len"), SHAPES)
def test_deberta_c2p_p2c(x64, rng, q_len, mem_len):
    heads, head_dim, bucket_size, max_position = 2, 4, 4, 8
    q = rng.normal(size=(2, q_len, heads, head_dim))
    k = rng.normal(size=(2, q_len + mem_len, heads, head_dim))
    pos_key = rng.normal(size=(2 * bucket_size, heads, head_dim))
    pos_query = rng.normal(size=(2 * bucket_size, heads, head_dim))
    q_pos, k_pos = _positions(q_len, mem_len)
    index = np.asarray(
        P.deberta_index(jnp.asarray(q_pos), jnp.asarray(k_pos), bucket_size, max_position)
    )
    np.testing.assert_allclose(
        P.deberta_c2p(jnp.asarray(q), jnp.asarray(pos_key), jnp.asarray(index)),
        ref.gathered_logits(q, pos_key, index),
        **TOL,
    )
    np.testing.assert_allclose(
        P.deberta_p2c(jnp.asarray(k), jnp.asarray(pos_query), jnp.asarray(index)),
        ref.gathered_logits(k, pos_query, index, by_key=True),
        **TOL,
    )


def test_deberta_index_is_clipped_bucket(x64):
    q_pos, k_pos = np.arange(300, 310), np.arange(0, 310)
    index = np.asarray(P.deberta_index(jnp.asarray(q_pos), jnp.asarray(k_pos), 16, 64))
    bucket = np.asarray(P.deberta_bucket(jnp.asarray(q_pos[:, None] - k_pos[None]), 16, 64))
    np.testing.assert_array_equal(index, np.clip(bucket + 16, 0, 31))
    assert index.min() >= 0 and index.max() == 31


@pytest.mark.parametrize(("q_len", "mem_len"), SHAPES)
@pytest.mark.parametrize("heads", [1, 3, 8])
def test_alibi_bias(x64, q_len, mem_len, heads):
    q_pos, k_pos = _positions(q_len, mem_len, offset=11)
    slopes = np.asarray(P.alibi_slopes(heads), np.float64)
    want = ref.alibi_bias(q_pos, k_pos, slopes)
    got = P.alibi_bias(jnp.asarray(q_pos), jnp.asarray(k_pos), jnp.asarray(slopes))
    np.testing.assert_allclose(got, want, **TOL)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize(("head_dim", "rotary_pairs"), [(8, 4), (10, 5), (8, 2)])
def test_rotate_columns_is_apply_rope_on_keys_laid_out_by_column(
    x64, rng, interleaved, head_dim, rotary_pairs
):
    """Keys ``[B, N, H, K]`` (the model's layout) rotated along their rows are the reference's
    rotation of ``[B, K, N, H]``, laid out the same way; partial rotary dims included."""
    x = rng.normal(size=(2, 5, 3, head_dim))  # [B, K, N, H]
    positions = np.array([0, 1, 7, 30, 1000])
    inv_freq = 1.0 / 10000.0 ** (np.arange(rotary_pairs) * 2 / (2 * rotary_pairs))
    want = ref.apply_rope(x, positions, inv_freq, 1.3, interleaved).transpose(0, 2, 3, 1)
    cos, sin = P.rope_cos_sin(jnp.asarray(positions), jnp.asarray(inv_freq), 1.3, jnp.float64)
    got = P.rotate_columns(jnp.asarray(x.transpose(0, 2, 3, 1)), cos, sin, interleaved=interleaved)
    np.testing.assert_allclose(got, want, **TOL)


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize(("head_dim", "rotary_pairs"), [(8, 4), (10, 5), (8, 2)])
@pytest.mark.parametrize("attention_factor", [1.0, 1.3])
def test_apply_rope(x64, rng, interleaved, head_dim, rotary_pairs, attention_factor):
    x = rng.normal(size=(2, 5, 3, head_dim))
    positions = np.array([0, 1, 7, 30, 1000])
    inv_freq = 1.0 / 10000.0 ** (np.arange(rotary_pairs) * 2 / (2 * rotary_pairs))
    want = ref.apply_rope(x, positions, inv_freq, attention_factor, interleaved)
    got = P.apply_rope(
        jnp.asarray(x),
        jnp.asarray(positions),
        jnp.asarray(inv_freq),
        attention_factor,
        interleaved=interleaved,
    )
    np.testing.assert_allclose(got, want, **TOL)
