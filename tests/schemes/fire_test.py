"""FIRE against a float64 loop of its formula, which depends on the query's position (so no
translation-invariance test: a test that its normaliser moves with the query instead)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from relpos_jax import TransformerLM, schemes
from relpos_jax.attention import Attention
from relpos_jax.config import ModelConfig
from relpos_jax.schemes import fire

CFG = ModelConfig.from_any(dict(position="fire", d_model=16, n_heads=4, d_ff=32, init_std=0.5))


def _bias(attention, q_pos, k_pos):
    tile = schemes.Tile(jnp.asarray(q_pos), jnp.asarray(k_pos), 0, 0)
    return np.asarray(schemes.get("fire").bias(attention.position, tile, None), np.float64)


def _reference(attention, q_pos, k_pos):
    p = {
        k: np.asarray(v[...], np.float64)
        for k, v in vars(attention.position).items()
        if k.startswith("fire_")
    }
    init_l = fire.threshold(attention.config)
    c, threshold = abs(float(p["fire_c"])), abs(float(p["fire_L_multiplier"]) * init_l)
    want = np.zeros((CFG.n_heads, len(q_pos), len(k_pos)))
    for i, qi in enumerate(q_pos):
        for j, kj in enumerate(k_pos):
            x = math.log(c * max(qi - kj, 0) + 1) / math.log(c * max(threshold, qi) + 1)
            hidden = np.maximum(x * p["fire_w1"] + p["fire_b1"], 0.0)
            want[:, i, j] = hidden @ p["fire_w2"] + p["fire_b2"]
    return want


def test_fire_bias_matches_its_formula_below_and_above_the_threshold():
    attention = Attention(CFG, rngs=nnx.Rngs(0))
    q_pos, k_pos = np.arange(4, 12), np.arange(0, 12)
    for threshold in (512.0, 6.0):  # every query below L; queries on both sides of L
        attention.position.fire_L_multiplier.set_value(jnp.asarray(threshold / fire.threshold(CFG)))
        want = _reference(attention, q_pos, k_pos)
        np.testing.assert_allclose(_bias(attention, q_pos, k_pos), want, rtol=1e-5, atol=1e-6)


def test_fire_normaliser_follows_the_query_position():
    """Past the threshold the same distance gets another bias at another query position."""
    attention = Attention(CFG, rngs=nnx.Rngs(1))
    attention.position.fire_L_multiplier.set_value(jnp.asarray(4.0 / fire.threshold(CFG)))
    near = _bias(attention, np.array([10]), np.array([7]))  # distance 3 at i = 10
    far = _bias(attention, np.array([1000]), np.array([997]))  # distance 3 at i = 1000
    assert np.abs(near - far).max() > 1e-4


def test_fire_parameters_get_gradients_and_masked_keys_give_no_nan():
    model = TransformerLM(CFG, rngs=nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.PRNGKey(0), (2, 8), 0, 256)
    grads = nnx.jit(nnx.grad(lambda m, tokens: m(tokens, m.init_mems(2))[0].std()))(model, tokens)
    named = {jax.tree_util.keystr(path): leaf for path, leaf in jax.tree.leaves_with_path(grads)}
    assert all(np.isfinite(np.asarray(leaf)).all() for leaf in named.values())
    for param in ("fire_w1", "fire_w2", "fire_c", "fire_L_multiplier"):
        (stacked,) = [leaf for name, leaf in named.items() if param in name]  # [layers, ...]
        assert stacked.shape[0] == CFG.n_layers
        assert all(float(jnp.abs(layer).sum()) > 0 for layer in stacked), param


def _dead_share(w1: np.ndarray, b1: np.ndarray) -> float:
    """The share of hidden units ``relu(w1·x + b1)`` that are 0 on every input x in [0, 1] (such a
    unit gets no gradient, ever): linear in x, so its two ends decide."""
    x = np.linspace(0.0, 1.0, 101)[:, None, None]
    return float(np.mean(np.all(x * w1 + b1 <= 0.0, axis=0)))


def test_fire_hidden_units_at_init_are_mostly_alive_on_inputs_in_0_1():
    """w1, b1 ~ U(−1, 1) (torch.nn.Linear(1, 32), the paper's listing): a unit is dead on [0, 1] iff
    b1 ≤ 0 and w1 + b1 ≤ 0, 3/8 of them in expectation; the former init (w1 ~ N(0, 1), b1 = 0)
    killed every unit with w1 ≤ 0, half of them. 64 draws of a layer: 2,048 units."""
    layers = [schemes.get("fire").layer_params(CFG, nnx.Rngs(seed)) for seed in range(64)]
    w1 = np.stack([np.asarray(p["fire_w1"][...]) for p in layers])
    b1 = np.stack([np.asarray(p["fire_b1"][...]) for p in layers])
    assert w1.min() >= -1.0 and w1.max() <= 1.0 and b1.min() >= -1.0 and b1.max() <= 1.0
    assert np.abs(b1).mean() > 0.4  # drawn, not zero
    share = _dead_share(w1, b1)
    assert abs(share - 3 / 8) < 0.04 and share < 0.42, share
    former = np.random.default_rng(0).normal(size=w1.shape)  # the former init, for contrast
    assert _dead_share(former, np.zeros_like(former)) > 0.46


def test_fire_threshold_starts_at_the_training_window_and_can_be_set():
    from relpos_jax import memory as memory_lib
    from relpos_jax.config import Config, ConfigError

    def run(**fields):
        model = dict(position="fire", d_model=16, n_heads=4, d_ff=32, n_layers=2, mem_len=24)
        model.update(fields.pop("model", {}))
        return Config.from_any(dict(model=model, data=dict(segment_len=40, **fields)))

    cfg = run()
    assert cfg.model.fire.threshold == 24 + 40  # memory + segment
    model = TransformerLM(cfg.model, rngs=nnx.Rngs(0))
    np.testing.assert_array_equal(
        fire.learned_threshold(model.blocks.attention.position), [64.0, 64.0]
    )
    # the longest query position + 1 of a training window (memory full): the threshold
    states = jnp.zeros((2, 1, 24, 16))
    ctx = model._position_context(memory_lib.Memory(states, jnp.asarray(24)), 40, 0, None, True)
    assert int(ctx.q_pos[-1]) + 1 == cfg.model.fire.threshold
    assert run(model=dict(mem_len=0)).model.fire.threshold == 40  # no memory: the segment
    assert run(model=dict(fire={"threshold": 100})).model.fire.threshold == 100  # set: kept
    set_model = TransformerLM(run(model=dict(fire={"threshold": 100})).model, rngs=nnx.Rngs(0))
    np.testing.assert_array_equal(
        fire.learned_threshold(set_model.blocks.attention.position), [100.0] * 2
    )
    # a model section alone (a notebook): mem_len + base.py's data.segment_len (128)
    alone = TransformerLM(dict(position="fire", d_model=16, n_heads=4, mem_len=8), rngs=nnx.Rngs(0))
    assert float(fire.learned_threshold(alone.blocks.attention.position)[0]) == 8 + 128
    assert run(model=dict(position="t5")).model.fire.threshold is None  # only FIRE's own field
    with pytest.raises(ConfigError, match=r"^model\.fire\.threshold=0 is invalid"):
        run(model=dict(fire={"threshold": 0}))
