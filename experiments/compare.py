"""How the sweeps summarise seeds and decide that two results differ: mean ± sd over seeds, the
twice-the-spread rule (``apart``), and the paired bootstrap over test windows (``Compare``).

How a table states its numbers and which differences it calls real (``Compare``): where every run
it holds kept its evaluation windows (``windows_of``: each window's bits and tokens, all on the same
windows), a mean reads ``mean [lo, hi]``, its 95 % bootstrap interval (seeds, then windows,
resampled: ``relpos_jax.analysis.bootstrap``), and "better than" is written only where the paired
interval of a difference excludes zero. Otherwise (results recorded without windows) a mean reads
``mean ± sd``, the sample standard deviation over seeds, and ``apart`` — the means differ by more
than twice the larger spread — is the bar; the table says which rule it used.
"""

from __future__ import annotations

import itertools
import math
import pathlib
import statistics
from collections.abc import Hashable, Sequence

import numpy as np

from relpos_jax.analysis import bootstrap


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return statistics.mean(values), spread


def mean_sd_text(values: Sequence[float], digits: int) -> str:
    """``mean ± sd`` of ``values`` with ``digits`` decimals, as the tables print it ("nan ± 0" for
    none)."""
    mean, sd = mean_sd(values) if values else (float("nan"), 0.0)
    return f"{mean:.{digits}f} ± {sd:.{digits}f}"


def contexts_text(values: Sequence[int], longest: int | None) -> str:
    """Contexts measured on a grid (each seed's RECL, best context): each seed's where they
    differ, one where they agree (a mean of grid points would be a context no run chose); "≥" at
    the grid's ``longest`` (a lower bound)."""
    texts = [f"≥{v}" if v == longest else str(v) for v in values]
    return ", ".join(texts) if len(set(values)) > 1 else texts[0]


def apart(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether the means differ by more than twice the larger spread (never with one seed)."""
    (mean_a, sd_a), (mean_b, sd_b) = mean_sd(a), mean_sd(b)
    if min(len(a), len(b)) < 2:
        return False
    return abs(mean_a - mean_b) > 2 * max(sd_a, sd_b)


def apart_in_ranking(order: Sequence, values: dict) -> list[tuple]:
    """The neighbours ``(a, b)`` of ``order`` (keys of ``values``, lowest mean first) whose seeds
    are ``apart``: where a table may write "a lower than b, next in the ranking"."""
    return [(a, b) for a, b in itertools.pairwise(order) if apart(values[a], values[b])]


WINDOWS = "_windows"  # the suffix of a run's fields that hold its evaluation windows
WINDOWS_AT_MOST = 4096
"""Blocks a run's windows are summed into for a sweep's JSON: a few hundred kB for a sweep, and
blocks of neighbouring windows (which share context) resampled whole."""


def windows_of(workdir: pathlib.Path, split: str = "test", at_most: int = WINDOWS_AT_MOST):
    """``{"bits", "tokens", "layout"}`` of a run's evaluation windows of ``split`` (beside its
    ``eval.json``), consecutive windows summed into at most ``at_most`` blocks (alike for every run
    scored on the same windows: still paired); None where its eval.json kept none."""
    from relpos_jax.eval_results import load_windows

    found = load_windows(workdir, split)
    return None if found is None else in_blocks(found, at_most)


def in_blocks(windows: dict, at_most: int = WINDOWS_AT_MOST, *, nested: bool = False) -> dict:
    """``windows`` (``{"bits", "tokens", "layout"}``) with consecutive ones summed into at most
    ``at_most`` blocks; with ``nested``, blocks of a power of two windows: segments of L on their
    grid then stay nested in the windows of any power-of-two multiple of L (or those in them), so
    that two lengths still pair on their shared blocks (135 segments of 64 would end mid-window of
    32,768)."""
    scores = bootstrap.Scores(windows["bits"], windows["tokens"], windows["layout"])
    size = math.ceil(scores.windows / at_most)
    if nested and size > 1:
        size = 1 << (size - 1).bit_length()  # the power of two at or above: still ≤ at_most blocks
    scores = scores.blocks(size)
    return {
        "bits": scores.bits[0],
        "tokens": scores.tokens.astype(np.int64),
        "layout": scores.layout,
    }


def has_windows(value) -> bool:
    """Whether a run's field holds windows (``sweep.read`` found their file), not only their
    description."""
    return isinstance(value, dict) and "bits" in value


def _paired_on_shared_blocks(scores: dict) -> dict:
    """``scores`` summed into the blocks they share (``bootstrap.on_shared_blocks``), or {} (the
    spread rule) where they are not on the same tokens, or where their windows do not nest: then
    the shared blocks are fewer than the coarsest group's windows (one row of 64-token segments
    against 32,768-token windows over the whole split may share 2 ends), too few to resample."""
    try:
        paired = bootstrap.on_shared_blocks(*scores.values())
    except ValueError:
        return {}
    if paired[0].windows < min(s.windows for s in scores.values()):
        return {}
    return dict(zip(scores, paired, strict=True))


class Compare:
    """A table's measure over seeds for each of its groups (``values``: key -> each seed's number;
    ``windows``: key -> each seed's windows, where recorded) and the rule it states them by: the
    bootstrap rule where every seed of every group has windows, all the same windows (else the
    spread rule; see the module's docstring). With ``shared_blocks``, groups scored on other
    windows over the same tokens (other lengths) are paired on the blocks whose ends they share
    (``bootstrap.on_shared_blocks``). Intervals are computed once each, seeded."""

    def __init__(
        self,
        values: dict[Hashable, list[float]],
        windows: dict | None = None,
        *,
        shared_blocks: bool = False,
    ) -> None:
        self.values = values
        self.scores: dict[Hashable, bootstrap.Scores] | None = None
        seeds = [(windows or {}).get(key) or [] for key in values]
        if values and all(
            len(w) == len(values[key]) and all(map(has_windows, w))
            for key, w in zip(values, seeds, strict=True)
        ):
            try:  # a group whose seeds were scored on other windows: the spread rule
                scores = {key: bootstrap.Scores.of(w) for key, w in zip(values, seeds, strict=True)}
            except ValueError:
                scores = {}
            if shared_blocks and scores:
                scores = _paired_on_shared_blocks(scores)
            first = next(iter(scores.values()), None)
            if first is not None and all(
                s.layout == first.layout and np.array_equal(s.tokens, first.tokens)
                for s in scores.values()
            ):
                self.scores = scores
        self._intervals: dict = {}
        self._differences: dict = {}

    @property
    def bootstrap(self) -> bool:
        """Whether the bootstrap rule is used (else the spread rule)."""
        return self.scores is not None

    def mean(self, key) -> float:
        """The point estimate: pooled bpc over the seeds' windows, or the seeds' mean."""
        return self.scores[key].point if self.scores else mean_sd(self.values[key])[0]

    def interval(self, key) -> bootstrap.Interval:
        if key not in self._intervals:
            self._intervals[key] = bootstrap.interval(self.scores[key])
        return self._intervals[key]

    def difference(self, a, b) -> bootstrap.Interval:
        """The paired interval of ``a`` − ``b`` (bootstrap rule only)."""
        if (a, b) not in self._differences:
            self._differences[a, b] = bootstrap.difference(self.scores[a], self.scores[b])
        return self._differences[a, b]

    def cell(self, key, digits: int) -> str:
        """``mean [lo, hi]`` or ``mean ± sd``."""
        if self.scores:
            return self.interval(key).text(digits)
        return mean_sd_text(self.values[key], digits)

    def apart(self, a, b) -> bool:
        """Whether ``a`` and ``b`` differ beyond chance: the paired interval of the difference
        excludes zero, or the means are ``apart``."""
        if self.scores:
            return self.difference(a, b).excludes_zero
        return apart(self.values[a], self.values[b])

    def in_ranking(self, order: Sequence) -> list[tuple]:
        """The neighbours of ``order`` (lowest first) that differ beyond chance."""
        return [(a, b) for a, b in itertools.pairwise(order) if self.apart(a, b)]

    def difference_text(self, a, b, digits: int) -> str:
        """`` (a − b: −0.0500 [−0.0700, −0.0300])`` after a statement (bootstrap rule); nothing
        under the spread rule, whose statements give no interval."""
        if not self.scores:
            return ""
        return f" (difference {self.difference(a, b).text(digits, signed=True)})"

    @property
    def summary_rule(self) -> str:
        """What a cell holds, for the table's header."""
        if not self.scores:
            return "mean ± sample sd over the seeds"
        first = next(iter(self.scores.values()))
        return (
            f"the mean over the seeds [its {bootstrap.LEVEL:.0%} bootstrap interval: the seeds, "
            f"then the {first.windows:,} windows ({first.layout}), resampled "
            f"{bootstrap.REPLICATES:,} times]"
        )

    @property
    def difference_rule(self) -> str:
        """When two groups differ beyond chance, for the heading of the table's statements."""
        if not self.scores:
            return "beyond twice the larger spread"
        return (
            f"whose {bootstrap.LEVEL:.0%} bootstrap interval, paired on the windows, excludes zero"
        )


def share_interval(k: int, n: int, level: float = 0.95) -> tuple[float, float]:
    """The exact (Clopper–Pearson) interval of the share ``k`` of ``n``: for counts of seeds that
    solve a task, each seed a draw of a lookup learnt or not."""
    from scipy import stats

    interval = stats.binomtest(k, n).proportion_ci(confidence_level=level, method="exact")
    return float(interval.low), float(interval.high)


def share_text(k: int, n: int) -> str:
    """``k of n [lo, hi]``, the share with its 95 % exact interval, as the tables print it."""
    low, high = share_interval(k, n)
    return f"{k} of {n} [{low:.2f}, {high:.2f}]"


def shares_p(a: tuple[int, int], b: tuple[int, int]) -> float:
    """The two-sided p of Fisher's exact test that the shares ``a`` and ``b`` (each ``(k, n)``)
    differ: "apart" where it is below 0.05."""
    return stratified_shares_p([(a, b)])


def holm(ps: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment of the p values of ``ps`` (tests of one family, such as a scheme
    each), in their order: the i-th smallest times the tests left (m − i + 1), never below the
    adjusted one before it, at most 1. One in ``ps`` is below 0.05 after it with probability at most
    0.05 where every null hypothesis holds."""
    adjusted, running = [0.0] * len(ps), 0.0
    for rank, index in enumerate(sorted(range(len(ps)), key=lambda i: ps[i])):
        running = max(running, min(1.0, (len(ps) - rank) * ps[index]))
        adjusted[index] = running
    return adjusted


def stratified_shares_p(pairs: Sequence[tuple[tuple[int, int], tuple[int, int]]]) -> float:
    """The two-sided p of the exact conditional test that, in every stratum (a pair of shares
    ``(a, b)``, each ``(k, n)``: one scheme's seeds under two conditions), the odds of success are
    the same under a and b. Each stratum's margins are fixed, so its count under a is
    hypergeometric; their sum's distribution is the convolution, and p sums the sums no likelier
    than the one observed (R's ``mantelhaen.test(exact = TRUE)``; one stratum: Fisher's test)."""
    from scipy import stats

    density, lowest, observed = np.ones(1), 0, 0
    for (k_a, n_a), (k_b, n_b) in pairs:
        solved = k_a + k_b
        low, high = max(0, solved - n_b), min(solved, n_a)
        stratum = stats.hypergeom(n_a + n_b, solved, n_a).pmf(np.arange(low, high + 1))
        density, lowest, observed = np.convolve(density, stratum), lowest + low, observed + k_a
    likelihood = density[observed - lowest]
    return float(min(1.0, density[density <= likelihood * (1 + 1e-7)].sum()))
