"""``relpos_jax.analysis.bootstrap``: intervals of bpc over windows and seeds, paired differences,
"better" only where a difference's interval excludes zero — checked as properties on synthetic
windows whose difficulty, seed spread and margins are known."""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np
import pytest

from relpos_jax.analysis import bootstrap
from relpos_jax.analysis.bootstrap import Scores

T = 64  # tokens a window


def _model(windows: int, *, seeds: int = 1, margin: float = 0.0, noise: float = 0.3, data=0,
           rng=None) -> Scores:  # fmt: skip
    """Windows of ``T`` tokens whose bpc is a shared difficulty (seeded by ``data``: the same text
    for every model with the same ``data``) plus ``margin`` plus the model's own noise."""
    hard = np.random.default_rng(data).gamma(4.0, 0.5, windows)
    rng = rng or np.random.default_rng(1000 + data)
    bpc = hard[None] + margin + rng.normal(0, noise, (seeds, windows))
    return Scores(bpc * T, np.full(windows, T), layout=f"test {windows}")


@pytest.mark.parametrize("windows, seeds", [(20, 1), (300, 1), (300, 3), (2000, 5)])
def test_the_interval_holds_the_point_estimate(windows, seeds):
    for k in range(5):
        a = _model(windows, seeds=seeds, data=k)
        found = bootstrap.interval(a, replicates=500, seed=k)
        assert found.contains(a.point) and found.lo < found.hi, (k, found)
        assert found.level == 0.95


def test_the_interval_shrinks_with_more_windows():
    widths = {}
    for windows in (100, 1_000, 10_000):
        found = bootstrap.interval(_model(windows), replicates=500)
        widths[windows] = found.hi - found.lo
    # a spread over windows: the width falls as 1/sqrt(W), by about √10 each step
    assert widths[1_000] < widths[100] / 2 and widths[10_000] < widths[1_000] / 2, widths


def test_seeds_widen_the_interval_where_they_differ():
    rng = np.random.default_rng(0)
    a = _model(1_000, seeds=3, noise=0.01, rng=rng)
    offsets = np.array([[-0.2], [0.0], [0.2]]) * T  # the seeds differ by 0.2 bpc
    spread = Scores(a.bits + offsets, a.tokens, a.layout)
    one = Scores(a.bits[:1], a.tokens, a.layout)
    assert spread.point == pytest.approx(a.point)
    wide, narrow = bootstrap.interval(spread), bootstrap.interval(one)
    assert wide.hi - wide.lo > 3 * (narrow.hi - narrow.lo)


@pytest.mark.parametrize("seeds", [1, 3])
def test_identical_models_differ_by_an_interval_around_zero_and_neither_is_better(seeds):
    a = _model(500, seeds=seeds)
    twin = Scores(a.bits.copy(), a.tokens.copy(), a.layout)
    found = bootstrap.difference(a, twin)
    assert found.point == 0.0 and found.contains(0.0) and not found.excludes_zero
    assert not bootstrap.better(a, twin) and not bootstrap.better(twin, a)
    if seeds == 1:  # the same windows drawn for both: every replicate's difference is zero
        assert found.lo == found.hi == 0.0


@pytest.mark.parametrize("seeds, margin", [(1, 0.001), (3, 0.1)])
def test_a_model_worse_by_a_margin_on_every_window_is_found_worse(seeds, margin):
    """One seed: any margin (the windows cancel); three: one beyond the seeds' spread (their means
    differ by about 0.3 / √400 = 0.015 bpc, resampled on their own for each model)."""
    a = _model(400, seeds=seeds)
    worse = Scores(a.bits + margin * a.tokens, a.tokens, a.layout)  # on every window of every seed
    found = bootstrap.difference(a, worse)
    assert found.point == pytest.approx(-margin)
    assert found.hi < 0 and bootstrap.better(a, worse) and not bootstrap.better(worse, a)


def test_pairing_narrows_the_difference_where_windows_share_difficulty():
    a, b = _model(1_000, noise=0.05), _model(1_000, margin=0.02, noise=0.05)  # same text
    paired = bootstrap.difference(a, b)
    unpaired = bootstrap.difference(a, b, paired=False)
    assert paired.point == unpaired.point == pytest.approx(a.point - b.point)
    assert (paired.hi - paired.lo) < (unpaired.hi - unpaired.lo) / 5
    assert bootstrap.better(a, b) and unpaired.contains(0.0)  # only pairing finds the 0.02


def test_the_same_seed_gives_the_same_interval():
    a, b = _model(300, seeds=2), _model(300, seeds=3, margin=0.01)
    assert bootstrap.interval(a, seed=3) == bootstrap.interval(a, seed=3)
    assert bootstrap.difference(a, b, seed=3) == bootstrap.difference(a, b, seed=3)
    assert bootstrap.interval(a, seed=3) != bootstrap.interval(a, seed=4)
    # a's draws in a paired difference are those of its own interval, replicate by replicate
    alone = bootstrap._replicates([a], 200, 5, paired=True)[0]
    together = bootstrap._replicates([a, b], 200, 5, paired=True)[0]
    np.testing.assert_array_equal(alone, together)


def test_chunks_change_no_replicate(monkeypatch):
    a = _model(50, seeds=2)
    whole = bootstrap._replicates([a], 100, 0, paired=True)
    monkeypatch.setattr(bootstrap, "_CHUNK_ELEMENTS", 50 * 7)  # 7 replicates a chunk
    chunked = bootstrap._replicates([a], 100, 0, paired=True)
    assert chunked.shape == whole.shape and np.all(np.isfinite(chunked))


def test_the_point_estimate_is_exact_in_float64():
    # bits whose plain float64 sum loses the small terms: fsum keeps them
    bits = np.array([[1e16, 1.0, 1.0, 1.0, 3.0, 1e-3]])
    tokens = np.array([5, 1, 1, 1, 7, 1])
    exact = sum(map(Fraction, bits.ravel())) / int(tokens.sum())
    a = Scores(bits, tokens)
    assert a.point == float(exact)  # correctly rounded: Σ bits then one division
    assert sum(bits.ravel().tolist()) / tokens.sum() != float(exact)  # the naive sum is not
    reversed_ = Scores(bits[:, ::-1], tokens[::-1])
    assert reversed_.point == a.point  # independent of the windows' order
    # seeds pooled: the mean of the seeds' bpc, their tokens being the same
    two = _model(100, seeds=2)
    seed_bpc = [math.fsum(row) / math.fsum(two.tokens) for row in two.bits]
    assert two.point == pytest.approx(sum(seed_bpc) / 2, rel=1e-15)


def test_blocks_sum_consecutive_windows_and_stay_paired():
    a, b = _model(103, seeds=2), _model(103, margin=0.5, seeds=2)
    blocked = a.blocks(10)
    assert blocked.windows == 11 and blocked.point == pytest.approx(a.point, rel=1e-15)
    assert blocked.layout == "test 103, blocks of 10" and a.blocks(1) is a
    np.testing.assert_array_equal(blocked.tokens[-1], 3 * T)
    assert bootstrap.better(blocked, b.blocks(10))


def test_results_on_other_windows_of_the_same_tokens_pair_on_their_shared_blocks():
    fine = _model(96)  # windows of T tokens, in the text's order
    coarse = Scores(fine.bits.reshape(1, 32, 3).sum(2), np.full(32, 3 * T), "windows of 3T")
    a, b = bootstrap.on_shared_blocks(fine, coarse)  # the coarse windows: every third fine end
    np.testing.assert_array_equal(a.tokens, coarse.tokens)
    np.testing.assert_allclose(a.bits, coarse.bits, rtol=1e-15)
    assert a.layout == b.layout == "32 blocks shared by (test 96 | windows of 3T)"
    same = bootstrap.difference(a, b)  # the same text, summed in other windows
    assert max(abs(same.point), abs(same.lo), abs(same.hi)) < 1e-12
    assert bootstrap.better(*bootstrap.on_shared_blocks(fine, _model(96, margin=0.5).blocks(4)))
    # not nested: windows of 2 and of 3 tokens share every sixth token's end
    two = Scores(np.arange(6.0)[None], np.full(6, 2.0), "by 2")
    three = Scores(np.ones((1, 4)), np.full(4, 3.0), "by 3")
    (x, y) = bootstrap.on_shared_blocks(two, three)
    np.testing.assert_array_equal(x.bits, [[3.0, 12.0]])
    np.testing.assert_array_equal(y.bits, [[2.0, 2.0]])
    np.testing.assert_array_equal(x.tokens, y.tokens)
    assert bootstrap.on_shared_blocks(fine, fine) == (fine, fine)  # already paired: as they are
    with pytest.raises(ValueError, match=r"windows over \[11, 12\] tokens have no shared blocks"):
        bootstrap.on_shared_blocks(two, Scores(np.ones((1, 1)), np.array([11.0])))


def test_scores_of_seeds_and_what_cannot_be_paired():
    seeds = [{"bits": np.full(4, 2.0 * T + k), "tokens": np.full(4, T), "layout": "x"}
             for k in range(3)]  # fmt: skip
    a = Scores.of(seeds)
    assert (a.seeds, a.windows, a.layout) == (3, 4, "x")
    assert a.point == pytest.approx(2.0 + 1 / T)
    with pytest.raises(ValueError, match="not scored on the same windows"):
        Scores.of([seeds[0], {**seeds[1], "tokens": np.full(4, T + 1)}])
    with pytest.raises(ValueError, match="not scored on the same windows"):
        bootstrap.difference(a, Scores(a.bits, a.tokens, "y"))
    with pytest.raises(ValueError, match="not scored on the same windows"):
        bootstrap.difference(a, Scores(a.bits[:, :3], a.tokens[:3], "x"))
    shorter = bootstrap.difference(a, Scores(a.bits[:, :3], a.tokens[:3], "x"), paired=False)
    assert shorter.point == pytest.approx(0.0)
    with pytest.raises(ValueError, match="without tokens"):
        Scores(np.ones((1, 2)), np.array([1, 0]))
    with pytest.raises(ValueError, match="bits"):
        Scores(np.ones((1, 3)), np.ones(2))
    with pytest.raises(ValueError, match="level"):
        bootstrap.interval(a, level=95)


def test_interval_text():
    found = bootstrap.Interval(2.28504, 2.27, 2.30)
    assert found.text(4) == "2.2850 [2.2700, 2.3000]"
    assert bootstrap.Interval(-0.05, -0.07, -0.03).text(3, signed=True) == "-0.050 [-0.070, -0.030]"
    assert bootstrap.Interval(0.05, 0.03, 0.07).text(2, signed=True) == "+0.05 [+0.03, +0.07]"
