"""Table 6's init and best from per-token losses: answers known by construction, the shortest best
context on a tie, the gain's interval, and one clear line for bad input."""

from __future__ import annotations

import math

import numpy as np
import pytest

from relpos_jax.analysis.init_best import init_and_best


def _losses(means: dict[int, float], n: int = 4096, noise: float = 0.5, seed: int = 0):
    """Per-token losses (nats) at each context: one shared difficulty per token (what pairing
    cancels) plus the context's mean."""
    difficulty = np.random.default_rng(seed).gamma(2.0, noise, n)
    return {c: difficulty + m for c, m in means.items()}


def test_a_longer_context_that_helps_is_best_and_its_gain_is_beyond_chance():
    losses = _losses({0: 1.6, 64: 1.3, 128: 1.25, 256: 1.25})  # 128 and 256 tie: the shorter
    result = init_and_best(losses, 64, block=64, replicates=500)
    assert result["init"] == 64 and result["best"] == 128
    expected = {str(c): float(np.mean(v)) / math.log(2) for c, v in losses.items()}
    assert result["bpc"] == pytest.approx(expected, rel=1e-12)
    point, lo, hi = result["gain"]
    assert point == pytest.approx(expected["128"] - expected["64"], rel=1e-12)
    assert point == pytest.approx(-0.05 / math.log(2), rel=1e-9)
    assert lo <= point <= hi < 0  # shared difficulty cancels: the gain is beyond chance


def test_a_model_that_gains_nothing_from_more_context_is_best_at_init():
    losses = _losses({0: 1.6, 64: 1.3, 128: 1.3, 256: 1.4})
    assert init_and_best(losses, 64, block=64) == {
        "bpc": {str(c): pytest.approx(float(np.mean(v)) / math.log(2)) for c, v in losses.items()},
        "init": 64, "best": 64, "gain": [0.0, 0.0, 0.0],
    }  # fmt: skip


def test_a_gain_within_the_noise_has_an_interval_across_zero():
    rng = np.random.default_rng(1)
    base = rng.gamma(2.0, 0.5, 2048)
    losses = {0: base, 64: base + rng.normal(0, 0.3, base.size)}
    losses[64] += np.mean(base) - np.mean(losses[64]) - 1e-4  # lower by a hair: best, not better
    point, lo, hi = init_and_best(losses, 0, block=16, replicates=500)["gain"]
    assert init_and_best(losses, 0, block=16)["best"] == 64
    assert lo < 0 < hi and point == pytest.approx(-1e-4 / math.log(2), rel=1e-6)


@pytest.mark.parametrize(
    ("losses", "trained", "block", "message"),
    [({0: np.ones(8)}, 64, 4, "the trained context 64 is not among the contexts [0]"),
     ({0: np.ones(8), 64: np.ones(4)}, 64, 4, "the contexts scored [4, 8] tokens"),
     ({0: np.ones(8)}, 0, 0, "block=0 is invalid")],
)  # fmt: skip
def test_bad_input_gets_one_line_naming_the_field(losses, trained, block, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        init_and_best(losses, trained, block=block)
