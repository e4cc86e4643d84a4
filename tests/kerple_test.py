"""KERPLE (logarithmic) against a float64 loop of its formula; translation invariant; trainable."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from relpos_jax import TransformerLM, schemes
from relpos_jax.attention import Attention
from relpos_jax.config import ModelConfig

CFG = ModelConfig.from_any(dict(position="kerple", d_model=16, n_heads=4, d_ff=32))


def _bias(attention, q_pos, k_pos):
    tile = schemes.Tile(jnp.asarray(q_pos), jnp.asarray(k_pos), 0, 0)
    return np.asarray(schemes.get("kerple").bias(attention, tile, None), np.float64)


def test_kerple_bias_is_minus_r1_log_one_plus_r2_distance():
    attention = Attention(CFG, rngs=nnx.Rngs(0))
    attention.kerple_r2.set_value(jnp.asarray([0.5, 1e-3, 1.0, 2.0]))  # 1e-3 is clamped to 1e-2
    r1 = np.maximum(np.asarray(attention.kerple_r1[...], np.float64), 1e-2)
    r2 = np.maximum(np.asarray(attention.kerple_r2[...], np.float64), 1e-2)
    q_pos, k_pos = np.arange(3, 9), np.arange(0, 9)
    want = np.zeros((4, 6, 9))
    for n in range(4):
        for i, qi in enumerate(q_pos):
            for j, kj in enumerate(k_pos):
                want[n, i, j] = -r1[n] * math.log(1 + r2[n] * abs(qi - kj))
    np.testing.assert_allclose(_bias(attention, q_pos, k_pos), want, rtol=1e-6, atol=1e-6)


def test_kerple_is_translation_invariant():
    attention = Attention(CFG, rngs=nnx.Rngs(1))
    q_pos, k_pos = np.arange(5, 12), np.arange(0, 12)
    shifted = _bias(attention, q_pos + 1000, k_pos + 1000)
    np.testing.assert_allclose(shifted, _bias(attention, q_pos, k_pos), rtol=1e-6)


def test_kerple_parameters_get_gradients_through_the_model():
    model = TransformerLM(CFG, rngs=nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.PRNGKey(0), (2, 8), 0, 256)
    grads = nnx.jit(nnx.grad(lambda m, tokens: m(tokens, m.init_mems(2))[0].std()))(model, tokens)
    named = {jax.tree_util.keystr(path): leaf for path, leaf in jax.tree.leaves_with_path(grads)}
    kerple = [name for name in named if "kerple_r" in name]  # r1, r2: each [layers, heads]
    assert len(kerple) == 2 and all(named[name].shape[0] == CFG.n_layers for name in kerple)
    assert all(float(jnp.abs(layer).sum()) > 0 for name in kerple for layer in named[name])
