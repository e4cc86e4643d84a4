"""``rope_stretch``: the ``rope_scaling`` dicts of RoPE's length extensions, and YaRN's β scaled to the
trained length so that it keeps, ramps and interpolates the shares of the head it does for LLaMA 2."""

from __future__ import annotations

import numpy as np
import pytest

from relpos_jax.positions.rope import rope_inv_freq
from relpos_jax.positions.rope_stretch import STRETCHES, stretched, yarn_betas


def _yarn_shares(dim: int, train_len: int, betas: dict) -> tuple[float, float]:
    """The shares of a head's frequency pairs YaRN keeps and interpolates fully (factor 4)."""
    scaling = {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": train_len}
    stretched_freq, _ = rope_inv_freq(dim, 10000.0, scaling | betas)
    original, _ = rope_inv_freq(dim, 10000.0, None)
    ratio = np.asarray(stretched_freq) / np.asarray(original)
    return float(np.mean(np.isclose(ratio, 1.0))), float(np.mean(np.isclose(ratio, 0.25)))


def test_yarn_betas_keep_llamas_shares_of_the_head_at_this_trained_length():
    assert yarn_betas(4096) == {"beta_fast": 32.0, "beta_slow": 1.0}  # the defaults
    llama = _yarn_shares(128, 4096, {})  # head dim 128, L₀ 4,096: what β = 32, 1 were chosen for
    here = _yarn_shares(32, 128, yarn_betas(128))
    unscaled = _yarn_shares(32, 128, {})
    assert all(abs(a - b) <= 1 / 16 for a, b in zip(here, llama, strict=True)), (here, llama)
    assert unscaled[0] <= 1 / 16 < 0.25 < llama[0]  # the defaults keep one pair of 16 at 128
    scaling = stretched("yarn", 4, 128)
    assert scaling["beta_fast"] == 1.0 and scaling["beta_slow"] == 1 / 32


@pytest.mark.parametrize("kind", STRETCHES)
def test_every_stretch_divides_the_lowest_frequency_by_about_the_factor_and_none_at_1x(kind):
    assert stretched(kind, 1, 64) is None
    scaling = stretched(kind, 4, 64)
    original, _ = rope_inv_freq(32, 10000.0, None)
    inv_freq, _ = rope_inv_freq(32, 10000.0, scaling, seq_len=4 * 64)  # dynamic: at 4× L₀
    ratio = np.asarray(inv_freq) / np.asarray(original)
    assert np.all(ratio <= 1 + 1e-6) and ratio[-1] < 0.5  # nothing sped up; the slowest slowed
    if kind == "linear":
        np.testing.assert_allclose(ratio, 0.25, rtol=1e-6)
    else:  # the extensions that keep the fastest frequency (close to) as trained
        assert ratio[0] > 0.9


def test_an_unknown_stretch_is_refused_in_one_line_naming_the_choices():
    with pytest.raises(
        ValueError, match=r"kind='pi' is not a RoPE stretch; use one of linear, ntk"
    ):
        stretched("pi", 2, 64)
