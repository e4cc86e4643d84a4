"""xPos (Sun et al. 2023) against a float64 loop of its formula, and its decay against torchscale's.

Pair ``p`` of a query at stream position ``n`` is rotated by ``n·θ_p`` and scaled by ``ζ_p^{n/γ}``;
of a key at ``m``, rotated by ``m·θ_p`` and scaled by ``ζ_p^{−m/γ}``: the score is their product,
``/√H``. The loop uses the stream positions themselves (any origin), the model its centred window
offsets: they agree because only ``n − m`` matters.
"""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from relpos_jax import TransformerLM, schemes
from relpos_jax import positions as P
from relpos_jax.attention import Attention, PositionContext
from relpos_jax.config import ConfigError, ModelConfig
from relpos_jax.schemes import xpos
from tests import reference as ref

D, N, H = 8, 2, 4
GAMMA, SCALE_BASE = 0.4, 4.0  # a short scale base: the decay shows within a few positions


def test_decay_is_torchscales():
    # torchscale/component/xpos_relative_position.py: (arange(0, R, 2) + 0.4·R) / (1.4·R)
    np.testing.assert_allclose(xpos.decay(4, 0.4), [3.2 / 11.2, 5.2 / 11.2, 7.2 / 11.2, 9.2 / 11.2])
    assert float(xpos.decay(64, 0.4)[0]) == pytest.approx(0.4 / 1.4)  # the fastest pair


def _reference_scores(q, k, q_pos, k_pos, inv_freq, interleaved):
    """``[Tq, Tk]`` scores of one head, ``q [Tq, H]`` and ``k [Tk, H]``, pair by pair."""
    half = len(inv_freq)
    zeta = [(2 * p + GAMMA * 2 * half) / ((1 + GAMMA) * 2 * half) for p in range(half)]

    def transformed(x, position, sign):
        out = ref.apply_rope(x[None, None], [position], inv_freq, interleaved=interleaved)[0, 0]
        for p in range(half):
            pair = (2 * p, 2 * p + 1) if interleaved else (p, p + half)
            for dim in pair:
                out[dim] *= zeta[p] ** (sign * position / SCALE_BASE)
        return out

    qs = [transformed(q[i], n, +1) for i, n in enumerate(q_pos)]
    ks = [transformed(k[j], m, -1) for j, m in enumerate(k_pos)]
    return np.array([[qi @ kj / math.sqrt(H) for kj in ks] for qi in qs])


@pytest.mark.parametrize(("q_len", "mem_len", "valid"), [(4, 0, 0), (3, 5, 5), (3, 5, 2)])
@pytest.mark.parametrize(("fraction", "interleaved"), [(1.0, False), (0.5, True)])
def test_xpos_attention_matches_the_formula(x64, rng, q_len, mem_len, valid, fraction, interleaved):
    cfg = ModelConfig.from_any(dict(
        position="xpos", d_model=D, n_heads=N, d_ff=16, n_layers=1, rope_fraction=fraction,
        rope_interleaved=interleaved, xpos={"gamma": GAMMA, "scale_base": SCALE_BASE},
    ))  # fmt: skip
    w_q, w_kv, w_o = (rng.normal(size=s) for s in ((D, N, H), (D, 2, N, H), (N, H, D)))
    attention = Attention(cfg, rngs=nnx.Rngs(0))
    for name, value in {"w_q": w_q, "w_kv": w_kv, "w_o": w_o}.items():
        getattr(attention, name).set_value(jnp.asarray(value))
    x, mem = rng.normal(size=(2, q_len, D)), rng.normal(size=(2, mem_len, D))
    window = np.concatenate([mem, x], axis=1)
    stream = np.arange(q_len + mem_len) + 17  # any origin: only differences matter
    inv_freq, _ = P.rope_inv_freq(H, cfg.rope_base, partial_rotary_factor=fraction)
    allowed = np.array([[mem_len + i >= j >= mem_len - valid for j in range(len(stream))]
                        for i in range(q_len)])  # fmt: skip

    want = np.zeros((2, q_len, D))
    for b in range(2):
        for n in range(N):
            q, k, v = x[b] @ w_q[:, n], window[b] @ w_kv[:, 0, n], window[b] @ w_kv[:, 1, n]
            scores = _reference_scores(q, k, stream[mem_len:], stream, np.asarray(inv_freq),
                                       interleaved)  # fmt: skip
            for i in range(q_len):
                want[b, i] += (ref._softmax_row(scores[i], allowed[i]) @ v) @ w_o[n]

    k_pos = jnp.asarray(stream)
    model = TransformerLM(cfg, rngs=nnx.Rngs(0))  # its config is what the context reads
    context = schemes.get("xpos").context(model, k_pos[mem_len:], k_pos, True)
    ctx = PositionContext(k_pos[mem_len:], k_pos, mask=jnp.asarray(allowed), scheme=context)
    got = attention(jnp.asarray(x), jnp.asarray(window), ctx, deterministic=True)
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-9)


def test_xpos_settings_are_checked_in_one_line():
    for field, value in (("gamma", 0.0), ("scale_base", -1.0)):
        with pytest.raises(ConfigError, match=rf"^model\.xpos\.{field}=.* is invalid; "):
            ModelConfig.from_any(dict(position="xpos", xpos={field: value}))
