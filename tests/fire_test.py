"""FIRE against a float64 loop of its formula, which depends on the query's position (so no
translation-invariance test: a test that its normaliser moves with the query instead)."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from relpos_jax import TransformerLM, schemes
from relpos_jax.attention import Attention
from relpos_jax.config import ModelConfig

CFG = ModelConfig.from_any(dict(position="fire", d_model=16, n_heads=4, d_ff=32, init_std=0.5))


def _bias(attention, q_pos, k_pos):
    tile = schemes.Tile(jnp.asarray(q_pos), jnp.asarray(k_pos), 0, 0)
    return np.asarray(schemes.get("fire").bias(attention, tile, None), np.float64)


def _reference(attention, q_pos, k_pos):
    p = {
        k: np.asarray(v[...], np.float64)
        for k, v in vars(attention).items()
        if k.startswith("fire_")
    }
    c, threshold = abs(float(p["fire_c"])), abs(float(p["fire_L"]))
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
        attention.fire_L.set_value(jnp.asarray(threshold))
        want = _reference(attention, q_pos, k_pos)
        np.testing.assert_allclose(_bias(attention, q_pos, k_pos), want, rtol=1e-5, atol=1e-6)


def test_fire_normaliser_follows_the_query_position():
    """Past the threshold the same distance gets another bias at another query position."""
    attention = Attention(CFG, rngs=nnx.Rngs(1))
    attention.fire_L.set_value(jnp.asarray(4.0))
    near = _bias(attention, np.array([10]), np.array([7]))  # distance 3 at i = 10
    far = _bias(attention, np.array([1000]), np.array([997]))  # distance 3 at i = 1000
    assert np.abs(near - far).max() > 1e-4


def test_fire_parameters_get_gradients_and_masked_keys_give_no_nan():
    model = TransformerLM(CFG, rngs=nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.PRNGKey(0), (2, 8), 0, 256)
    grads = nnx.jit(nnx.grad(lambda m, tokens: m(tokens, m.init_mems(2))[0].std()))(model, tokens)
    named = {jax.tree_util.keystr(path): leaf for path, leaf in jax.tree.leaves_with_path(grads)}
    assert all(np.isfinite(np.asarray(leaf)).all() for leaf in named.values())
    for param in ("fire_w1", "fire_w2", "fire_c", "fire_L"):
        (stacked,) = [leaf for name, leaf in named.items() if param in name]  # [layers, ...]
        assert stacked.shape[0] == CFG.n_layers
        assert all(float(jnp.abs(layer).sum()) > 0 for layer in stacked), param
