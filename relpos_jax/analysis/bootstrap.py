"""Bootstrap confidence intervals of bits per byte, paired across models scored on the same tokens.

A model's scores are its evaluation windows' summed bits ``[S, W]`` (S seeds: training runs that
differ only in ``train.seed``) and each window's scored tokens ``[W]``, the same for every seed and
for every model evaluated on one split with one segment, rows and token count (``evaluate``'s
``windows``, in an order those settings fix). Its bpc is Σ bits / Σ tokens pooled over the seeds:
the mean of the seeds' bpc, whose tokens are the same.

``interval(a)`` resamples hierarchically, as the two sources of spread nest: each replicate draws S
of the seeds with replacement, then W of the windows with replacement, the same windows for every
seed drawn (the text is one; the seeds are different models of it). ``difference(a, b)`` draws one
set of windows for both models (paired: a window that is hard for one is hard for the other, and
that shared difficulty cancels in a − b) and each model's seeds on their own. ``better(a, b)``: the
interval of a − b lies below zero (lower bpc is better). Percentile intervals, 95 % and 2,000
replicates by default, from a seeded generator: the same inputs give the same interval.

Windows next to each other share context (with memory, a window's context is its neighbour), so
they are not independent: ``Scores.blocks`` sums consecutive windows into blocks, resampled whole
(a block bootstrap). Results laid out in other windows over the same tokens (two evaluation
lengths) pair on the blocks whose ends they share (``on_shared_blocks``). numpy only. Legend: S
seeds, W windows, R replicates.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Mapping, Sequence

import numpy as np

LEVEL = 0.95
REPLICATES = 2000
_CHUNK_ELEMENTS = 1 << 22  # window draws held at once (R·W): bounds the memory of a chunk


@dataclasses.dataclass(frozen=True, eq=False)
class Scores:
    """One model's summed bits ``bits [S, W]`` and scored tokens ``tokens [W]`` per window; ``layout``
    names what placed the windows (segment, rows, tokens), checked equal where two are paired."""

    bits: np.ndarray
    tokens: np.ndarray
    layout: str | None = None

    def __post_init__(self) -> None:
        bits = np.atleast_2d(np.asarray(self.bits, np.float64))
        tokens = np.asarray(self.tokens, np.float64)
        if bits.ndim != 2 or tokens.ndim != 1 or bits.shape[1] != tokens.shape[0]:
            raise ValueError(
                f"bootstrap: bits {bits.shape} and tokens {tokens.shape} are invalid; "
                "pass bits [seeds, windows] and tokens [windows]"
            )
        if bits.shape[1] == 0 or not (np.all(tokens > 0) and np.all(np.isfinite(bits))):
            raise ValueError("bootstrap: no windows, a window without tokens, or non-finite bits")
        object.__setattr__(self, "bits", bits)
        object.__setattr__(self, "tokens", tokens)

    @classmethod
    def of(cls, seeds: Sequence[Mapping]) -> Scores:
        """The scores of a model's seeds, each ``{"bits", "tokens", "layout"}`` (``evaluate``'s
        ``windows``), which must hold the same windows."""
        if not seeds:
            raise ValueError("bootstrap: no seeds")
        tokens, layouts = np.asarray(seeds[0]["tokens"]), {s.get("layout") for s in seeds}
        if len(layouts) > 1 or any(not np.array_equal(s["tokens"], tokens) for s in seeds):
            raise ValueError(
                f"bootstrap: the seeds were not scored on the same windows ({layouts})"
            )
        return cls(np.stack([np.asarray(s["bits"]) for s in seeds]), tokens, layouts.pop())

    @property
    def seeds(self) -> int:
        return self.bits.shape[0]

    @property
    def windows(self) -> int:
        return self.bits.shape[1]

    @property
    def point(self) -> float:
        """Σ bits / Σ tokens over every seed and window: each sum correctly rounded (``math.fsum``),
        so the estimate does not depend on the order or the number of windows."""
        return math.fsum(self.bits.ravel()) / (self.seeds * math.fsum(self.tokens))

    def blocks(self, size: int) -> Scores:
        """Consecutive windows summed ``size`` at a time (the last block may be shorter): the units
        of a block bootstrap. The same for every model with the same windows, so still paired."""
        if size <= 1:
            return self
        starts = np.arange(0, self.windows, size)
        layout = None if self.layout is None else f"{self.layout}, blocks of {size}"
        return Scores(
            np.add.reduceat(self.bits, starts, axis=1), np.add.reduceat(self.tokens, starts), layout
        )


def on_shared_blocks(*scores: Scores) -> tuple[Scores, ...]:
    """``scores`` laid out in other windows over the same tokens (e.g. one length's segments and
    four times that length's), each with its windows in the text's order, summed into the blocks
    whose ends all of them share: the same blocks of the same tokens for each, so paired. Where all
    are already on the same windows, they are returned as they are."""
    if not scores:
        return ()
    first = scores[0]
    if all(s.layout == first.layout and np.array_equal(s.tokens, first.tokens) for s in scores):
        return scores
    ends = [np.cumsum(s.tokens) for s in scores]  # exact: integer counts well below 2**53
    if len({float(e[-1]) for e in ends}) > 1:
        raise ValueError(
            f"bootstrap: windows over {sorted({int(e[-1]) for e in ends})} tokens have no shared "
            "blocks; pair only results scored on the same tokens"
        )
    shared = functools.reduce(np.intersect1d, ends)  # sorted, holding the last end
    layouts = " | ".join(dict.fromkeys(str(s.layout) for s in scores))
    layout = f"{len(shared)} blocks shared by ({layouts})"
    out = []
    for s, e in zip(scores, ends, strict=True):
        last = np.searchsorted(e, shared)  # the window each shared block ends with
        starts = np.concatenate([[0], last[:-1] + 1])
        out.append(
            Scores(
                np.add.reduceat(s.bits, starts, axis=1), np.add.reduceat(s.tokens, starts), layout
            )
        )
    return tuple(out)


@dataclasses.dataclass(frozen=True)
class Interval:
    """A point estimate and its percentile interval ``[lo, hi]`` at ``level``."""

    point: float
    lo: float
    hi: float
    level: float = LEVEL

    def contains(self, value: float) -> bool:
        return self.lo <= value <= self.hi

    @property
    def excludes_zero(self) -> bool:
        return self.lo > 0 or self.hi < 0

    def text(self, digits: int, signed: bool = False) -> str:
        """``point [lo, hi]`` with ``digits`` decimals (``signed``: with +/−)."""
        f = f"{'+' if signed else ''}.{digits}f"
        return f"{self.point:{f}} [{self.lo:{f}}, {self.hi:{f}}]"


def interval(
    a: Scores, *, level: float = LEVEL, replicates: int = REPLICATES, seed: int = 0
) -> Interval:
    """The percentile interval of ``a``'s bpc, seeds and windows resampled (hierarchically)."""
    (stats,) = _replicates([a], replicates, seed, paired=True)
    return _percentile(a.point, stats, level)


def difference(
    a: Scores,
    b: Scores,
    *,
    level: float = LEVEL,
    replicates: int = REPLICATES,
    seed: int = 0,
    paired: bool = True,
) -> Interval:
    """The interval of bpc(a) − bpc(b): the same windows drawn for both (``paired``; they must hold
    the same windows) or each its own (``paired=False``: as if scored on unrelated text), the seeds
    of each model drawn on their own."""
    if paired:
        _check_same_windows(a, b)
    stats_a, stats_b = _replicates([a, b], replicates, seed, paired=paired)
    return _percentile(a.point - b.point, stats_a - stats_b, level)


def better(a: Scores, b: Scores, **options) -> bool:
    """Whether ``a`` has lower bpc than ``b`` beyond chance: the paired interval of a − b
    (``difference``, same options) lies wholly below zero. Never for identical scores."""
    return difference(a, b, **options).hi < 0


def _check_same_windows(a: Scores, b: Scores) -> None:
    if (
        (a.layout is not None and b.layout is not None and a.layout != b.layout)
        or a.windows != b.windows
        or not np.array_equal(a.tokens, b.tokens)
    ):
        raise ValueError(
            f"bootstrap: the two models were not scored on the same windows ({a.layout!r}, "
            f"{b.layout!r}); pairing needs the same split, segment, rows and tokens "
            "(or pass paired=False)"
        )


def _replicates(models: Sequence[Scores], replicates: int, seed: int, paired: bool) -> np.ndarray:
    """Each model's bpc in ``replicates`` resamples ``[len(models), R]``. The generators are split
    from ``seed`` (``SeedSequence.spawn``): the shared windows' first, then each model's seeds,
    then (unpaired) each model's own windows; so ``interval(a)`` equals the ``a`` half of a paired
    ``difference(a, b)`` replicate by replicate."""
    if replicates < 1:
        raise ValueError(f"bootstrap: replicates={replicates} is invalid; use 1 or more")
    n = len(models)
    streams = [np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(1 + 2 * n)]
    window_rngs = [streams[0]] * n if paired else streams[1 + n :]
    seed_rngs = streams[1 : 1 + n]
    chunk = max(1, _CHUNK_ELEMENTS // max(m.windows for m in models))
    out = np.empty((n, replicates))
    for start in range(0, replicates, chunk):
        r = min(chunk, replicates - start)
        counts = {}  # one draw of windows per generator: shared by every model when paired
        for k, model in enumerate(models):
            key = id(window_rngs[k])
            if key not in counts:
                counts[key] = _counts(window_rngs[k], model.windows, r)
            window_counts = counts[key]  # [R, W]
            seed_counts = _counts(seed_rngs[k], model.seeds, r)  # [R, S]
            per_seed = window_counts @ model.bits.T  # [R, S]: each seed's bits on the drawn windows
            tokens = window_counts @ model.tokens  # [R]
            out[k, start : start + r] = (seed_counts * per_seed).sum(1) / (model.seeds * tokens)
    return out


def _counts(rng: np.random.Generator, size: int, replicates: int) -> np.ndarray:
    """How often each of ``size`` items is drawn in each of ``replicates`` draws of ``size`` with
    replacement ``[R, size]`` (float64: the weights of a matrix product)."""
    if size == 1:
        return np.ones((replicates, 1))
    drawn = rng.integers(0, size, (replicates, size)) + size * np.arange(replicates)[:, None]
    return np.bincount(drawn.ravel(), minlength=replicates * size).reshape(replicates, size) * 1.0


def _percentile(point: float, stats: np.ndarray, level: float) -> Interval:
    if not 0 < level < 1:
        raise ValueError(f"bootstrap: level={level} is invalid; use a fraction in (0, 1)")
    lo, hi = np.quantile(stats, [(1 - level) / 2, (1 + level) / 2])
    return Interval(point, float(lo), float(hi), level)
