"""relpos_jax.analysis.viz: the numbers behind the plots (against the library and the model's parameters),
and what each plot draws."""

from __future__ import annotations

import math

import jax.numpy as jnp
import matplotlib.pyplot as plt
import numpy as np
import pytest
from matplotlib.figure import Figure

from relpos_jax import positions as P
from relpos_jax.analysis import viz
from tests.helpers import tiny_model

DISTANCES = np.arange(0, 20)


@pytest.fixture(scope="module")
def txl_with_memory():
    """A tiny txl model and its memory after one 4-token segment: 4 of the 5 slots written."""
    return _with_memory(tiny_model("txl"))


def _with_memory(model):
    _, mems = model(jnp.array([[1, 2, 3, 4]]), model.init_mems(1))  # segments of 4: shapes reused
    return model, mems


def test_alibi_bias_is_minus_slope_times_distance():
    bias = viz.position_bias("alibi", DISTANCES, num_heads=6)
    slopes = np.asarray(P.alibi_slopes(6), np.float64)
    np.testing.assert_allclose(bias, -slopes[:, None] * np.abs(DISTANCES), atol=1e-5)
    library = P.alibi_bias(jnp.asarray(DISTANCES), jnp.zeros(1, jnp.int32), P.alibi_slopes(6))
    np.testing.assert_allclose(bias, library[:, :, 0], rtol=1e-6)
    from_model = viz.position_bias_from_model(tiny_model("alibi"), 1, DISTANCES)
    alibi = viz.position_bias("alibi", DISTANCES, num_heads=4)
    np.testing.assert_allclose(from_model, alibi, atol=1e-5)


def test_t5_bias_is_the_table_row_of_the_bucket_and_equal_within_a_bucket():
    model = tiny_model("t5")  # 8 causal buckets up to distance 12
    bias = viz.position_bias_from_model(model, 0, DISTANCES)
    table = model.position.t5_table[...]
    library = P.t5_bias(
        jnp.asarray(DISTANCES), jnp.zeros(1, jnp.int32), table, bidirectional=False, max_distance=12
    )
    np.testing.assert_allclose(bias, library[:, :, 0], atol=1e-6)  # (content + bias) − content
    buckets = np.asarray(
        P.t5_bucket(DISTANCES, bidirectional=False, num_buckets=8, max_distance=12)
    )
    shared = [b for b in np.unique(buckets) if (buckets == b).sum() > 1]
    assert any(b >= 4 for b in shared)  # log buckets that several distances share
    for b in np.unique(buckets):
        same = bias[:, buckets == b]
        np.testing.assert_array_equal(same, np.repeat(same[:, :1], same.shape[1], axis=1))
    assert len({tuple(col) for col in bias.T}) == len(np.unique(buckets))


def test_rope_term_at_distance_zero_is_q_dot_k_and_decays_as_a_cosine_sum(rng):
    q, k = rng.standard_normal((2, 3, 8))
    bias = viz.position_bias("rope", [0, 7], num_heads=3, head_dim=8, query=q, key=k)
    np.testing.assert_allclose(bias[:, 0], (q * k).sum(-1) / math.sqrt(8), rtol=1e-5)
    # key = query: Σ_i (a_i² + b_i²)·cos(d·θ_i) over the rotate-half pairs (i, i + 4), scaled 1/√8.
    inv_freq = np.asarray(P.rope_inv_freq(8)[0], np.float64)
    energy = q[:, :4] ** 2 + q[:, 4:] ** 2
    expected = np.stack([energy @ np.cos(d * inv_freq) for d in (0, 7, 100)], axis=1) / math.sqrt(8)
    got = viz.position_bias("rope", [0, 7, 100], num_heads=3, head_dim=8, query=q)
    np.testing.assert_allclose(got, expected, rtol=1e-5)


def test_rope_from_model_uses_its_scaling_factor(rng):
    scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 16}
    model = tiny_model("rope", rope_scaling=scaling)
    q = rng.standard_normal((4, 8))
    bias = viz.position_bias_from_model(model, 0, [0, 3], query=q)
    factor = P.rope_inv_freq(8, scaling=scaling)[1]
    np.testing.assert_allclose(bias[:, 0], factor**2 * (q * q).sum(-1) / math.sqrt(8), rtol=1e-5)


@pytest.mark.parametrize("overrides", [{}, {"txl": {"untie_r": True}, "clamp_len": 3}])
def test_txl_bias_from_model_is_v_w_r_r_d(overrides):
    model = tiny_model("txl", **overrides)
    k_len, layer = 9, 1
    attention = model.layer(layer).attention
    w_r = np.asarray(attention.position.w_r[...], np.float64)
    v = np.asarray((attention if overrides else model).position.v[...], np.float64)
    r = np.asarray(P.relative_sinusoid(k_len, 32, overrides.get("clamp_len")), np.float64)
    distances = [0, 2, 5, 8]
    expected = np.stack(
        [np.einsum("d,dnh,nh->n", r[k_len - 1 - d], w_r, v) for d in distances], axis=1
    ) / math.sqrt(8)
    zeros = np.zeros((4, 8))  # no content: the global position term (d) alone
    bias = viz.position_bias_from_model(model, layer, distances, query=zeros, key=zeros)
    np.testing.assert_allclose(bias, expected, rtol=1e-5, atol=1e-6)
    # The same term through the model's fast path: a zero query leaves (q + v)·W_R·R = v·W_R·R.
    r_knh = jnp.einsum("kd,dnh->knh", jnp.asarray(r, jnp.float32), attention.position.w_r[...])
    fast = P.txl_position_logits(jnp.zeros((1, 1, 4, 8)), r_knh, jnp.asarray(v, jnp.float32))
    np.testing.assert_allclose(bias, fast[0, :, 0, ::-1][:, distances] / math.sqrt(8), rtol=1e-5)


def test_shaw_bias_is_the_query_against_the_clamped_key_table(rng):
    model = tiny_model("shaw")  # max distance 3
    q = rng.standard_normal((4, 8))
    bias = viz.position_bias_from_model(model, 1, DISTANCES, query=q)
    table = np.asarray(model.layer(1).attention.position.table_k[...], np.float64)
    expected = q @ table[np.clip(DISTANCES, -3, 3) + 3].T / math.sqrt(8)
    np.testing.assert_allclose(bias, expected, rtol=1e-5, atol=1e-6)
    np.testing.assert_array_equal(bias[:, DISTANCES == 19], bias[:, DISTANCES == 3])


def test_deberta_bias_is_c2p_plus_p2c_of_the_library(rng):
    model = tiny_model("deberta")  # bucket size 4, max position 16
    q, k = rng.standard_normal((2, 4, 8))
    bias = viz.position_bias_from_model(model, 0, DISTANCES, query=q, key=k)
    attention = model.layer(0).attention
    rel = model.position.rel_norm(model.position.rel_embed[...])
    pos_key = jnp.einsum("rd,dnh->rnh", rel, attention.w_kv[...][:, 0])
    pos_query = jnp.einsum("rd,dnh->rnh", rel, attention.w_q[...])
    index = P.deberta_index(jnp.zeros(1, jnp.int32), -jnp.asarray(DISTANCES), 4, 16)  # q − k = d
    keys = jnp.broadcast_to(jnp.asarray(k, jnp.float32), (1, DISTANCES.size, 4, 8))
    c2p = P.deberta_c2p(jnp.asarray(q, jnp.float32)[None, None], pos_key, index)
    p2c = P.deberta_p2c(keys, pos_query, index)
    expected = (c2p + p2c)[0, :, 0] / math.sqrt(3 * 8)
    np.testing.assert_allclose(bias, expected, rtol=1e-4, atol=1e-5)


def test_none_is_zero_and_absolute_or_unknown_inputs_are_refused():
    np.testing.assert_array_equal(viz.position_bias("none", [0, 1], num_heads=2), np.zeros((2, 2)))
    for position in ("sinusoid", "learned"):
        with pytest.raises(ValueError, match="absolute"):
            viz.position_bias(position, [0, 1])
    with pytest.raises(ValueError, match=r"model.table=.* not a model field"):
        viz.position_bias("alibi", [0, 1], table=np.zeros((4, 2)))
    with pytest.raises(ValueError, match="ints ≥ 0"):
        viz.position_bias("alibi", [-1, 1])
    with pytest.raises(ValueError, match="use one of"):
        viz.position_bias("nope", [0, 1])


def test_attention_map_is_a_distribution_over_written_past_keys(txl_with_memory):
    model, mems = txl_with_memory
    weights = viz.attention_weights(model, jnp.array([[4, 5, 6, 7]]), mems, layer=1, head=None)
    assert weights.shape == (4, 4, 9)  # heads, 4 queries, 5 memory slots + 4 segment keys
    np.testing.assert_allclose(weights.sum(-1), 1.0, atol=1e-6)
    assert (weights[:, :, :1] == 0).all()  # the memory slot never written
    future = np.arange(9)[None, :] > 5 + np.arange(4)[:, None]  # query i sits at key 5 + i
    assert (weights[:, future] == 0).all()
    assert (weights[:, ~future & (np.arange(9) >= 1)] > 0).all()  # every written past key counts
    np.testing.assert_array_equal(
        viz.attention_weights(model, jnp.array([4, 5, 6, 7]), mems, layer=1, head=2), weights[2]
    )


@pytest.mark.parametrize("pre_norm_rope", [False, True])
def test_attention_weights_reproduce_the_layer_output(txl_with_memory, pre_norm_rope):
    """weights · values · W_o must equal the module's own output for the same layer input."""
    model, mems = (
        _with_memory(tiny_model("rope", pre_norm=True)) if pre_norm_rope else txl_with_memory
    )
    tokens, layer = jnp.array([[4, 5, 6, 7]]), 1
    _, new_mems = model(tokens, mems)
    x = new_mems.states[layer][:, -4:]  # the memory stores each layer's input
    block = model.layer(layer)
    window = jnp.concatenate([mems.states[layer], x], axis=1)
    if block.pre_norm:
        window = block.norm_attention(window)
        x = window[:, 5:]
    ctx = model._position_context(mems, 4, 0, None, True)
    expected = block.attention(x, window, ctx, deterministic=True)[0]
    weights = viz.attention_weights(model, tokens, mems, layer=layer, head=None)
    values = jnp.einsum("kd,dnh->knh", window[0], block.attention.w_kv[...][:, 1])
    out = jnp.einsum("nqk,knh,nhd->qd", weights, values, block.attention.w_o[...])
    np.testing.assert_allclose(out, expected, rtol=1e-4, atol=1e-5)


def test_yarn_ramp_keeps_high_frequencies_and_interpolates_low_ones():
    scaling = {"rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 1024}
    gamma = viz.yarn_ramp(64, 10000.0, scaling)
    plain = np.asarray(P.rope_inv_freq(64)[0], np.float64)
    scaled = np.asarray(P.rope_inv_freq(64, scaling=scaling)[0], np.float64)
    assert gamma.shape == (32,) and (np.diff(gamma) <= 0).all()
    assert (gamma[:5] == 1).all() and (scaled[:5] == plain[:5]).all()
    np.testing.assert_allclose(gamma[-5:], 0.0, atol=1e-6)
    np.testing.assert_allclose(scaled[-5:] / plain[-5:], 1 / 8, rtol=1e-6)
    assert ((gamma > 0) & (gamma < 1)).any()  # the ramp itself
    np.testing.assert_allclose(plain * ((1 - gamma) / 8 + gamma), scaled, rtol=1e-6)
    np.testing.assert_allclose(viz.yarn_ramp(64, scaling={"rope_type": "linear", "factor": 2}), 0)


def test_plots_draw_one_line_per_head_scaling_and_ramp():
    bias = viz.position_bias("alibi", DISTANCES[::-1], num_heads=4)
    ax = viz.plot_bias_vs_distance(bias, DISTANCES[::-1], title="alibi")
    assert len(ax.lines) == 4 and ax.get_title() == "alibi"
    np.testing.assert_array_equal(ax.lines[1].get_xdata(), DISTANCES)  # sorted by distance
    np.testing.assert_array_equal(ax.lines[1].get_ydata(), bias[1, ::-1])

    scalings = {name: viz.ROPE_SCALINGS[name] for name in ("default", "ntk x4", "yarn x4")}
    ax = viz.plot_rope_wavelengths(16, scalings=scalings, context_len=2048)
    assert len(ax.lines) == 4 and ax.get_yscale() == "log"
    np.testing.assert_allclose(ax.lines[0].get_ydata(), 2 * np.pi / P.rope_inv_freq(16)[0])
    assert ax.lines[3].get_ydata()[0] == 2048

    ax = viz.plot_yarn_ramp(64, ax=Figure().add_subplot())
    assert len(ax.lines) == 1
    np.testing.assert_array_equal(ax.lines[0].get_ydata(), viz.yarn_ramp(64))


def test_attention_map_plot_marks_the_memory_boundary(tmp_path):
    figures_before = plt.get_fignums()
    weights = np.tril(np.ones((4, 9)), k=5) / np.tril(np.ones((4, 9)), k=5).sum(1, keepdims=True)
    ax = viz.plot_attention_map(weights, mem_len=5, title="layer 1, head 0")
    assert len(ax.lines) == 1 and list(ax.lines[0].get_xdata()) == [4.5, 4.5]
    assert len(ax.images) == 1 and len(ax.get_figure().axes) == 2  # the map and its colorbar
    assert ax.get_xlabel().startswith("key (0–4: memory")
    assert not viz.plot_attention_map(weights, mem_len=0, colorbar=False).lines
    with pytest.raises(ValueError, match="mem_len"):
        viz.plot_attention_map(weights, mem_len=10)
    path = viz.save(ax, tmp_path / "plots" / "map.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plt.get_fignums() == figures_before  # no pyplot figure was opened
