"""Properties every position function must have: translation invariance, RoPE's relative dot
product, clamping beyond the tables, and jit / vmap / grad safety with one compile per shape."""

from __future__ import annotations

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relpos_jax import positions as P

SETTINGS = settings(max_examples=25, deadline=None, derandomize=True)
key = jax.random.PRNGKey


def _window(q_len, mem_len, offset):
    k_pos = jnp.arange(q_len + mem_len) + offset
    return k_pos[mem_len:], k_pos


# Each relative scheme as a function of explicit positions -> logits or bias.
def _shaw(q_pos, k_pos):
    q = jax.random.normal(key(0), (1, len(q_pos), 2, 4))
    return P.shaw_key_logits(q, jax.random.normal(key(1), (9, 2, 4)), q_pos, k_pos)


def _shaw_values(q_pos, k_pos):
    weights = jax.random.uniform(key(2), (1, 2, len(q_pos), len(k_pos)))
    return P.shaw_value_output(weights, jax.random.normal(key(3), (7, 4)), q_pos, k_pos)


def _t5(q_pos, k_pos):
    return P.t5_bias(q_pos, k_pos, jax.random.normal(key(4), (32, 3)), bidirectional=False)


def _deberta(q_pos, k_pos):
    index = P.deberta_index(q_pos, k_pos, 8, 32)
    q = jax.random.normal(key(5), (1, len(q_pos), 2, 4))
    k = jax.random.normal(key(6), (1, len(k_pos), 2, 4))
    table = jax.random.normal(key(7), (16, 2, 4))
    return P.deberta_c2p(q, table, index) + P.deberta_p2c(k, table, index)


def _alibi(q_pos, k_pos):
    return P.alibi_bias(q_pos, k_pos, P.alibi_slopes(6))


def _rope(q_pos, k_pos):
    q = jax.random.normal(key(8), (1, len(q_pos), 2, 8))
    k = jax.random.normal(key(9), (1, len(k_pos), 2, 8))
    inv_freq, factor = P.rope_inv_freq(
        8, scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
    )
    q = P.apply_rope(q, q_pos, inv_freq, factor)
    k = P.apply_rope(k, k_pos, inv_freq, factor)
    return jnp.einsum("bqnh,bknh->bnqk", q, k)


# Jitted once per shape; hypothesis then varies the positions, which are data.
RELATIVE = {
    name: jax.jit(f)
    for name, f in {
        "shaw": _shaw,
        "shaw_values": _shaw_values,
        "t5": _t5,
        "deberta": _deberta,
        "alibi": _alibi,
        "rope": _rope,
    }.items()
}
WINDOWS = [(1, 0), (4, 3), (3, 6)]  # (q_len, mem_len)


@pytest.mark.parametrize("name", sorted(RELATIVE))
@pytest.mark.parametrize(("q_len", "mem_len"), WINDOWS)
@SETTINGS
@given(shift=st.integers(-300, 300))
def test_translation_invariance(name, q_len, mem_len, shift):
    scheme = RELATIVE[name]
    q_pos, k_pos = _window(q_len, mem_len, 40)
    base = scheme(q_pos, k_pos)
    shifted = scheme(q_pos + shift, k_pos + shift)
    np.testing.assert_allclose(shifted, base, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize(("q_len", "mem_len"), [*WINDOWS, (6, 8)])
def test_txl_term_depends_on_distance_only(q_len, mem_len):
    """Entry (i, j) of the causal window equals (i + 1, j + 1): the same distance, any offset."""
    k_len = q_len + mem_len
    q = jnp.broadcast_to(jax.random.normal(key(0), (1, 1, 2, 4)), (1, q_len, 2, 4))
    r = jnp.einsum(
        "kd,dnh->knh", P.relative_sinusoid(k_len, 6), jax.random.normal(key(1), (6, 2, 4))
    )
    logits = np.asarray(P.txl_position_logits(q, r))
    for i in range(q_len - 1):
        for j in range(i + mem_len):
            np.testing.assert_allclose(logits[..., i, j], logits[..., i + 1, j + 1], rtol=1e-5)


@SETTINGS
@given(m=st.integers(0, 2000), n=st.integers(0, 2000), shift=st.integers(0, 2000))
def test_rope_dot_product_depends_only_on_distance(m, n, shift):
    q = jax.random.normal(key(0), (1, 1, 1, 16))
    k = jax.random.normal(key(1), (1, 1, 1, 16))
    inv_freq, _ = P.rope_inv_freq(16)

    @jax.jit
    def dot(a, b):
        return jnp.sum(P.apply_rope(q, a[None], inv_freq) * P.apply_rope(k, b[None], inv_freq))

    m, n, shift = jnp.array(m), jnp.array(n), jnp.array(shift)
    assert float(dot(m, n)) == pytest.approx(float(dot(m + shift, n + shift)), abs=2e-3)


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotate_with_precomputed_angles_is_apply_rope(interleaved):
    """``rotate(x, *rope_cos_sin(...))``, what the model does once per forward, is ``apply_rope``."""
    x = jax.random.normal(key(0), (2, 7, 3, 12))
    inv_freq, factor = P.rope_inv_freq(
        12, scaling={"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
    )
    positions = jnp.arange(7) + 40
    want = P.apply_rope(x, positions, inv_freq, factor, interleaved=interleaved)
    got = P.rotate(x, *P.rope_cos_sin(positions, inv_freq, factor), interleaved=interleaved)
    np.testing.assert_array_equal(got, want)


def test_attention_rotated_by_window_offsets_equals_stream_positions():
    """The model rotates queries and keys by their offsets in the window (0 … K − 1), not their
    stream positions; RoPE scores depend only on the difference, so the attention is the same."""
    from flax import nnx

    from relpos_jax.attention import Attention, PositionContext
    from relpos_jax.config import ModelConfig

    cfg = ModelConfig.from_any(dict(position="rope", d_model=32, n_heads=2, init_std=0.3))
    attention = Attention(cfg, rngs=nnx.Rngs(0))
    x = jax.random.normal(key(0), (2, 4, 32))
    window = jnp.concatenate([jax.random.normal(key(1), (2, 6, 32)), x], axis=1)
    inv_freq, factor = P.rope_inv_freq(cfg.head_dim)
    outputs = []
    for start in (0, 3000):  # window offsets; stream positions of a late segment
        k_pos = jnp.arange(10) + start
        cos, sin = P.rope_cos_sin(k_pos, inv_freq, factor)
        ctx = PositionContext(
            q_pos=k_pos[6:], k_pos=k_pos, mask=k_pos[6:, None] >= k_pos[None, :],
            scheme={"q": (cos[6:], sin[6:]), "k": (cos, sin)},
        )  # fmt: skip
        outputs.append(attention(x, window, ctx, deterministic=True))
    np.testing.assert_allclose(outputs[0], outputs[1], rtol=2e-4, atol=2e-4)


def test_rope_preserves_norm_and_partial_dims_pass_through():
    x = jax.random.normal(key(0), (2, 5, 3, 12))
    inv_freq, _ = P.rope_inv_freq(12, partial_rotary_factor=0.5)
    out = P.apply_rope(x, jnp.arange(5) * 100, inv_freq)
    np.testing.assert_allclose(
        jnp.linalg.norm(out, axis=-1), jnp.linalg.norm(x, axis=-1), rtol=1e-5
    )
    np.testing.assert_array_equal(out[..., 6:], x[..., 6:])


def test_shaw_clamps_beyond_the_table():
    k = 3
    table = jax.random.normal(key(0), (2 * k + 1, 4))
    q = jax.random.normal(key(1), (1, 1, 1, 4))
    k_pos = jnp.array([-10_000, -4, -3, 0, 3, 4, 10_000])
    logits = P.shaw_key_logits(q, table, jnp.array([0]), k_pos)[0, 0, 0]
    want = q[0, 0, 0] @ table[jnp.array([6, 6, 6, 3, 0, 0, 0])].T
    np.testing.assert_allclose(logits, want, rtol=1e-6)
    values = P.shaw_value_output(jnp.ones((1, 1, 1, 7)), table, jnp.array([0]), k_pos)
    np.testing.assert_allclose(
        values[0, 0, 0], table[jnp.array([6, 6, 6, 3, 0, 0, 0])].sum(0), rtol=1e-5
    )


def test_tables_are_never_indexed_out_of_bounds():
    far = jnp.array([-(10**6), -513, -1, 0, 1, 513, 10**6])
    assert set(np.asarray(P.t5_bucket(far, bidirectional=True)).tolist()) <= set(range(32))
    assert set(np.asarray(P.t5_bucket(far, bidirectional=False)).tolist()) <= set(range(32))
    index = P.deberta_index(jnp.array([0]), far, 256, 512)
    assert int(index.min()) >= 0 and int(index.max()) <= 511
    table = jnp.arange(10.0)[:, None]
    np.testing.assert_array_equal(P.learned_lookup(table, far)[:, 0], [0, 0, 0, 0, 1, 9, 9])


def test_alibi_slopes_rule():
    np.testing.assert_allclose(P.alibi_slopes(8), [2.0**-i for i in range(1, 9)])
    # Not a power of two: the 4-head slopes, then every other slope of the 8-head sequence.
    np.testing.assert_allclose(P.alibi_slopes(6), [2**-2, 2**-4, 2**-6, 2**-8, 2**-1, 2**-3])


@pytest.mark.parametrize("name", sorted(RELATIVE))
def test_jit_equals_eager_and_vmap_equals_loop(name):
    scheme = RELATIVE[name]
    q_pos, k_pos = _window(4, 3, 0)
    eager = scheme.__wrapped__(q_pos, k_pos)
    np.testing.assert_allclose(scheme(q_pos, k_pos), eager, rtol=1e-5)
    batched = jax.jit(jax.vmap(scheme))(
        jnp.stack([q_pos, q_pos + 7]), jnp.stack([k_pos, k_pos + 9])
    )
    np.testing.assert_allclose(batched[0], eager, rtol=1e-5)
    np.testing.assert_allclose(batched[1], scheme(q_pos + 7, k_pos + 9), rtol=1e-5)


def test_gradients_flow_to_every_input():
    q_pos, k_pos = _window(4, 3, 0)
    q = jax.random.normal(key(0), (1, 4, 2, 8))
    r = jax.random.normal(key(1), (7, 2, 8))
    table = jax.random.normal(key(2), (5, 8))
    weights = jax.nn.softmax(jax.random.normal(key(3), (1, 2, 4, 7)))
    inv_freq, _ = P.rope_inv_freq(8)

    @jax.jit
    def all_grads(q, r, table, weights, slopes):
        txl = jax.grad(lambda q, r: P.txl_position_logits(q, r).sum(), (0, 1))(q, r)
        shaw = jax.grad(lambda w, t: P.shaw_value_output(w, t, q_pos, k_pos).sum(), (0, 1))(
            weights, table
        )
        alibi = jax.grad(lambda s: P.alibi_bias(q_pos, k_pos, s).sum())(slopes)
        rope = jax.grad(lambda x: (P.apply_rope(x, q_pos, inv_freq) ** 3).sum())(q)
        return (*txl, *shaw, alibi, rope)

    for g in all_grads(q, r, table, weights, P.alibi_slopes(4)):
        assert bool(jnp.isfinite(g).all()) and float(jnp.abs(g).sum()) > 0


def test_compiles_once_per_shape():
    @jax.jit
    @chex.assert_max_traces(n=1)
    def scores(q, r, table, q_pos, k_pos, seq_len):
        inv_freq, _ = P.rope_inv_freq(
            8,
            scaling={"rope_type": "dynamic", "factor": 2.0, "original_max_position_embeddings": 4},
            seq_len=seq_len,
        )
        rotated = P.apply_rope(q, q_pos, inv_freq)
        return (
            P.txl_position_logits(rotated, r)
            + P.shaw_key_logits(q, table, q_pos, k_pos)
            + P.alibi_bias(q_pos, k_pos, P.alibi_slopes(2))
        )

    q = jnp.ones((1, 4, 2, 8))
    r = jnp.ones((7, 2, 8))
    table = jnp.ones((5, 8))
    for offset in range(3):
        q_pos, k_pos = _window(4, 3, offset * 100)
        scores(q * offset, r, table, q_pos, k_pos, 4 + offset * 10)
