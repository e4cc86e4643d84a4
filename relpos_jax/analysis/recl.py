"""Relative Effective Context Length (RECL), Transformer-XL (Dai et al. 2019) §4.3 and Appendix C.

The definition (arXiv 1901.02860, Appendix C "Details About RECL"), restated:

- A *model group* M = {m_1 … m_N} is compared together; RECL is a property of a model *within* its
  group (Table 8 has two groups), never of a model alone.
- l_i(c, t) = −log P_{m_i}(x_t | x_{t−1} … x_{t−c}): the loss of model i on token t with context c.
- Baseline, per token: b(c, t) = min_i l_i(c, t), the best loss of the whole group at the short
  context c (a per-token minimum, not the loss of the best model).
- T = the top-r fraction of tokens t with the largest b(c, t): the tokens that the short context
  serves worst (r = 0.1, 0.5, 1.0 in Table 8).
- Relative loss f_i(c, c′) = mean over t ∈ T of min(b(c, t), l_i(c′, t)): a long-context loss only
  counts where it beats the group's short-context baseline. Hence f_i(c, c) = mean_T b(c, t).
- Relative gain g_i(c, c′) = (exp f_i(c, c) − exp f_i(c, c′)) / exp f_i(c, c), the relative
  perplexity reduction (losses in nats).
- RECL: start at the first c with c′ = c + Δ; while g_i(c, c′) ≥ 0.01 step c ← c′; at the first
  g_i(c, c′) < 0.01 return RECL = c. The baseline and T are recomputed at each c.

Interpretation where the paper is silent: |T| = ceil(r·n) tokens, ties broken by token order; a
model whose gain never falls below the threshold gets the largest context evaluated (a lower bound
on its RECL). ``recl`` takes any increasing contexts (each consecutive pair a (c, c′) step);
``fixed_grid`` gives the paper's c, c + Δ, c + 2Δ, ….

Uncertainty (not in the paper): ``recl_intervals`` resamples the scored tokens with replacement (in
blocks of ``block`` consecutive tokens; 1: single tokens), the same draw for every model of the
group, recomputes every model's RECL in each replicate (baseline, T and all), and reports percentile
intervals: the spread that the choice of test tokens puts on RECL, for these trained models. From a
seeded generator, so the same losses and seed give the same intervals.

The per-token losses l_i(c, t) come from ``relpos_jax.analysis.context_losses``: each model scored as
it was trained (with memory, or in sliding windows without it; ``scoring_losses``).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence

import numpy as np

from relpos_jax.analysis.bootstrap import LEVEL, REPLICATES, Interval
from relpos_jax.analysis.context_losses import (  # noqa: F401  (the measurements, re-exported)
    MEMORY,
    SCORINGS,
    WINDOW,
    context_token_losses,
    scoring_for,
    scoring_losses,
    window_token_losses,
)

THRESHOLD = 0.01  # the paper's threshold on the relative gain
_CHUNK_ELEMENTS = 1 << 22  # resampled token weights held at once (replicates × tokens)


def _check_r(r: float) -> None:
    if isinstance(r, bool) or not isinstance(r, int | float) or not 0 < r <= 1:
        raise ValueError(f"recl: r={r!r} is invalid; use 0 < r <= 1 (the paper uses 0.1, 0.5, 1.0)")


def top_r(baseline: np.ndarray, r: float) -> np.ndarray:
    """Indices of the ceil(r·n) tokens with the largest baseline loss (ties: earlier token first)."""
    _check_r(r)
    baseline = np.asarray(baseline)
    count = max(1, math.ceil(r * baseline.size - 1e-9))  # 1e-9: r·n = 10.000000000000002
    return np.argsort(-baseline, kind="stable")[:count]


def relative_gain(baseline: np.ndarray, long_losses: np.ndarray, *, r: float) -> float:
    """g(c, c′) of one model: ``baseline`` = b(c, ·) of its group, ``long_losses`` = l_i(c′, ·)."""
    baseline = np.asarray(baseline, np.float64)
    long_losses = np.asarray(long_losses, np.float64)
    if baseline.shape != long_losses.shape or baseline.ndim != 1:
        raise ValueError(
            f"relative_gain: baseline.shape={baseline.shape} and long_losses.shape="
            f"{long_losses.shape} are invalid; pass per-token losses [n] of the same tokens"
        )
    hard = top_r(baseline, r)
    f_short = baseline[hard].mean()  # f_i(c, c): min(b, l_i(c, ·)) is b itself
    f_long = np.minimum(baseline[hard], long_losses[hard]).mean()
    return float(-np.expm1(f_long - f_short))  # (e^f − e^f′) / e^f without overflow


def _validated(token_losses: Mapping[str, Mapping[int, np.ndarray]]) -> tuple[list[int], dict]:
    """The common context lengths and the losses as float64 arrays; one clear error otherwise."""
    if not token_losses:
        raise ValueError(
            "recl: token_losses is empty; pass {model name: {context length: per-token losses}}"
        )
    contexts: list[int] | None = None
    first = n = None
    table = {}
    for name, by_context in token_losses.items():
        lengths = list(by_context)
        if len(lengths) < 2:
            raise ValueError(
                f"recl: token_losses[{name!r}] has context lengths {lengths}; pass at least two "
                "(a short c and a long c + Δ)"
            )
        if any(isinstance(c, bool) or not isinstance(c, int | np.integer) for c in lengths):
            raise ValueError(
                f"recl: token_losses[{name!r}] has context lengths {lengths}; use int keys"
            )
        if any(b <= a for a, b in itertools.pairwise(lengths)):
            raise ValueError(
                f"recl: token_losses[{name!r}] context lengths {lengths} are not increasing; "
                "pass them in ascending order, each once"
            )
        if contexts is None:
            contexts, first = [int(c) for c in lengths], name
        elif [int(c) for c in lengths] != contexts:
            raise ValueError(
                f"recl: token_losses[{name!r}] context lengths {lengths} differ from "
                f"token_losses[{first!r}] {contexts}; evaluate every model of the group at the "
                "same context lengths"
            )
        table[name] = {}
        for c, losses in by_context.items():
            losses = np.asarray(losses, np.float64)
            if losses.ndim != 1 or not losses.size or not np.isfinite(losses).all():
                raise ValueError(
                    f"recl: token_losses[{name!r}][{c}] has shape {losses.shape}; pass a non-empty "
                    "1-D array of finite per-token losses (nats)"
                )
            if n is None:
                n = losses.size
            elif losses.size != n:
                raise ValueError(
                    f"recl: token_losses[{name!r}][{c}] has {losses.size} tokens, others have {n}; "
                    "score the same tokens for every model and context length"
                )
            table[name][int(c)] = losses
    return contexts, table


def relative_gains(
    token_losses: Mapping[str, Mapping[int, np.ndarray]], *, r: float
) -> dict[str, dict[int, float]]:
    """g_i(c, c′) for each model and each consecutive pair of context lengths, keyed by c."""
    _check_r(r)
    contexts, table = _validated(token_losses)
    gains: dict[str, dict[int, float]] = {name: {} for name in table}
    for c, longer in itertools.pairwise(contexts):
        baseline = np.min([losses[c] for losses in table.values()], axis=0)  # b(c, t)
        for name, losses in table.items():
            gains[name][c] = relative_gain(baseline, losses[longer], r=r)
    return gains


def _check_threshold(threshold: float) -> None:
    if isinstance(threshold, bool) or not isinstance(threshold, int | float) or threshold < 0:
        raise ValueError(
            f"recl: threshold={threshold!r} is invalid; use a number >= 0 (paper: 0.01)"
        )


def _stacked(token_losses: Mapping[str, Mapping[int, np.ndarray]]):
    """(model names, contexts, losses ``[M, C, n]``): M models, C contexts, n tokens."""
    contexts, table = _validated(token_losses)
    names = list(table)
    return names, contexts, np.stack([[table[name][c] for c in contexts] for name in names])


def _recls(
    losses_MCN: np.ndarray,
    contexts: Sequence[int],
    r_values: Sequence[float],
    threshold: float,
    weights_RN: np.ndarray | None = None,
) -> np.ndarray:
    """RECL ``[R, len(r_values), M]`` of every model of the group ``losses_MCN`` for each r, in R
    resamples given as how often each token is drawn (``weights_RN``; None: every token once).

    The one computation behind ``recl`` and the bootstrap. A resample's top r is its ⌈r·n′⌉ drawn
    tokens with the largest baseline (n′ = Σ weights): each c's tokens are sorted once, and each
    resample takes the first of them by cumulative weight, the copies of a token being equal in
    every model (ties between tokens: the earlier first, as ``top_r``)."""
    n = losses_MCN.shape[2]
    weights = np.ones((1, n)) if weights_RN is None else np.asarray(weights_RN, np.float64)
    drawn = weights.sum(1)  # n′ of each resample
    counts = [np.maximum(1, np.ceil(r * drawn - 1e-9)) for r in r_values]  # 1e-9: r·n = 10.0…02
    result = np.full((len(weights), len(r_values), losses_MCN.shape[0]), contexts[-1], np.int64)
    gaining = np.ones(result.shape, bool)  # not yet below the threshold
    for k, c in enumerate(contexts[:-1]):
        baseline = losses_MCN[:, k].min(axis=0)  # b(c, t)
        order = np.argsort(-baseline, kind="stable")  # the hardest first, ties by token order
        hard = baseline[order]
        # [N, 1 + M]: b(c, t), then min(b(c, t), l_i(c′, t)) of each model, the hardest first
        columns = np.concatenate([hard[None], np.minimum(hard, losses_MCN[:, k + 1, order])]).T
        in_order = weights[:, order]
        before = np.cumsum(in_order, axis=1) - in_order  # the weight drawn before each token
        for i, count in enumerate(counts):
            if not gaining[:, i].any():
                continue
            taken = np.clip(count[:, None] - before, 0, in_order)  # [R, N]: its copies in T
            f = (taken @ columns) / count[:, None]  # f_i(c, c) (column 0), then each f_i(c, c′)
            gain = -np.expm1(f[:, 1:] - f[:, :1])  # (e^f − e^f′) / e^f without overflow
            stops = gaining[:, i] & (gain < threshold)
            result[:, i][stops] = c
            gaining[:, i] &= ~stops
        if not gaining.any():
            break
    return result


def recl(
    token_losses: Mapping[str, Mapping[int, np.ndarray]],
    *,
    r: float,
    threshold: float = THRESHOLD,
) -> dict[str, int]:
    """RECL of each model of the group ``token_losses`` {model: {context: per-token losses}}."""
    _check_threshold(threshold)
    _check_r(r)
    names, contexts, losses = _stacked(token_losses)
    ((values,),) = _recls(losses, contexts, [r], threshold)
    return {name: int(value) for name, value in zip(names, values, strict=True)}


def fixed_grid(delta: int, longest: int, first: int = 0) -> list[int]:
    """The paper's contexts c, c + Δ, c + 2Δ, … from ``first`` to ``longest`` (inclusive)."""
    values = {"delta": delta, "longest": longest, "first": first}
    if any(isinstance(v, bool) or not isinstance(v, int | np.integer) for v in values.values()):
        raise ValueError(f"fixed_grid: {values} are invalid; pass ints")
    if delta < 1 or first < 0 or longest < first + delta or (longest - first) % delta:
        raise ValueError(
            f"fixed_grid: delta={delta}, longest={longest}, first={first} are invalid; use "
            "delta >= 1, first >= 0 and longest = first + k·delta for some k >= 1"
        )
    return list(range(int(first), int(longest) + 1, int(delta)))


def recl_intervals(
    token_losses: Mapping[str, Mapping[int, np.ndarray]],
    *,
    r_values: Sequence[float] = (0.1, 0.5, 1.0),
    threshold: float = THRESHOLD,
    level: float = LEVEL,
    replicates: int = REPLICATES,
    seed: int = 0,
    block: int = 1,
) -> dict[str, dict[float, Interval]]:
    """{model: {r: RECL and its percentile interval}} of the group ``token_losses``.

    Each replicate draws ⌈n / block⌉ blocks of ``block`` consecutive scored tokens with replacement
    (the last block may be shorter), one draw for every model, and recomputes each model's RECL on
    the drawn tokens (as ``recl`` of the resampled losses would, without copying them);
    the interval's ends are replicate values (``inverted_cdf`` quantiles), so they lie on the grid
    of contexts. The point is ``recl`` of all the tokens; a percentile interval need not contain it.
    """
    _check_threshold(threshold)
    for r in r_values:
        _check_r(r)
    for name, value in {"replicates": replicates, "block": block}.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"recl_intervals: {name}={value!r} is invalid; use an int >= 1")
    if not 0 < level < 1:
        raise ValueError(f"recl_intervals: level={level!r} is invalid; use a fraction in (0, 1)")
    names, contexts, losses = _stacked(token_losses)
    (point,) = _recls(losses, contexts, r_values, threshold)
    n = losses.shape[2]
    blocks = -(-n // block)
    block_of = np.arange(n) // block
    rng = np.random.default_rng(seed)
    chunk = max(1, _CHUNK_ELEMENTS // n)
    stats = []
    for start in range(0, replicates, chunk):
        size = min(chunk, replicates - start)
        drawn = rng.integers(0, blocks, (size, blocks)) + blocks * np.arange(size)[:, None]
        per_block = np.bincount(drawn.ravel(), minlength=size * blocks).reshape(size, blocks)
        stats.append(_recls(losses, contexts, r_values, threshold, per_block[:, block_of]))
    lo, hi = np.quantile(
        np.concatenate(stats), [(1 - level) / 2, (1 + level) / 2], axis=0, method="inverted_cdf"
    )
    return {
        name: {
            r: Interval(int(point[i, m]), int(lo[i, m]), int(hi[i, m]), level)
            for i, r in enumerate(r_values)
        }
        for m, name in enumerate(names)
    }
