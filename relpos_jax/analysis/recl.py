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

Interpretation where the paper is silent: the contexts need not be evenly spaced (each consecutive
pair is a (c, c + Δ) step); |T| = ceil(r·n) tokens, ties broken by token order; a model whose gain
never falls below the threshold gets the largest context evaluated (a lower bound on its RECL).

``context_token_losses`` measures l(c, t) for a ``TransformerLM`` with the memory length as the
context knob, the way the paper's models are evaluated ("attention length"); see its docstring.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Mapping, Sequence

import jax
import numpy as np
import optax
from flax import nnx

from relpos_jax import data as data_lib
from relpos_jax.evaluate import with_config
from relpos_jax.memory import scan_segments
from relpos_jax.model import TransformerLM

THRESHOLD = 0.01  # the paper's threshold on the relative gain


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


def recl(
    token_losses: Mapping[str, Mapping[int, np.ndarray]],
    *,
    r: float,
    threshold: float = THRESHOLD,
) -> dict[str, int]:
    """RECL of each model of the group ``token_losses`` {model: {context: per-token losses}}."""
    if isinstance(threshold, bool) or not isinstance(threshold, int | float) or threshold < 0:
        raise ValueError(
            f"recl: threshold={threshold!r} is invalid; use a number >= 0 (paper: 0.01)"
        )
    gains = relative_gains(token_losses, r=r)
    result = {}
    for name, by_context in gains.items():
        lengths = list(by_context)
        stop = next((c for c in lengths if by_context[c] < threshold), None)
        # never below the threshold: the longest context measured is a lower bound on the RECL
        result[name] = stop if stop is not None else int(list(token_losses[name])[-1])
    return result


def token_losses(logits: jax.Array, segment: dict) -> jax.Array:
    """The readout of ``segment_losses``: each target's loss ``[B, T]`` in nats."""
    return optax.softmax_cross_entropy_with_integer_labels(logits, segment["targets"])


@functools.partial(jax.jit, static_argnums=0)
def segment_losses(graphdef, state, segments: dict, mems):
    """Per-token losses ``[S, B, T]`` of S consecutive segments ``segments["inputs" | "targets"]``,
    the memory carried from each to the next."""
    return scan_segments(nnx.merge(graphdef, state), segments, mems, token_losses)[0]


def context_token_losses(
    model: TransformerLM,
    stream_or_tokens: data_lib.TokenStream | np.ndarray,
    contexts: Sequence[int],
    *,
    segment_len: int,
    n_tokens: int,
    batch_size: int,
    same_length: bool = True,
) -> dict[int, np.ndarray]:
    """{context: per-token losses [n_tokens]} of the same target tokens, with ``mem_len = context``.

    The stream is evaluated as ``evaluate`` does (``batch_size`` rows, segments of ``segment_len``,
    memory carried), after a warm-up of W = ceil(max(contexts) / segment_len) segments per row so
    that every memory is full when scoring starts. Scored: targets W·T + 1 … W·T + n_tokens of the
    stream, in order — the same tokens for every context (and for every model called with the same
    arguments, as a RECL group needs).

    ``same_length=True`` (what the paper's evaluation scripts pass) makes every query attend to
    exactly ``context`` earlier positions plus itself at every layer, wherever it sits in its
    segment; ``context`` 0 is then the model given the current token alone. With
    ``same_length=False`` a query at offset j of its segment sees ``context + j`` earlier positions,
    and ``context`` 0 is plain evaluation without memory. Either way, with recurrence the memory
    states themselves carry older information: this measures the context the model can use through
    an attention span of ``context``, not a from-scratch window (for one layer the two coincide).
    """
    contexts = list(contexts)
    if not contexts or any(
        isinstance(c, bool) or not isinstance(c, int | np.integer) or c < 0 for c in contexts
    ):
        raise ValueError(
            f"context_token_losses: contexts={contexts!r} is invalid; pass memory lengths >= 0"
        )
    if any(b <= a for a, b in itertools.pairwise(contexts)):
        raise ValueError(
            f"context_token_losses: contexts={contexts!r} are not increasing; pass them in "
            "ascending order, each once"
        )
    sizes = {"segment_len": segment_len, "n_tokens": n_tokens, "batch_size": batch_size}
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"context_token_losses: {name}={value!r} is invalid; use an int >= 1")
    stream = (
        stream_or_tokens
        if isinstance(stream_or_tokens, data_lib.TokenStream)
        else data_lib.ArrayStream(np.asarray(stream_or_tokens))
    )
    seg = segment_len
    warmup = -(-max(contexts) // seg) * seg
    needed = warmup + n_tokens + 1
    if len(stream) < needed:
        raise ValueError(
            f"context_token_losses: the stream has {len(stream):,} tokens; n_tokens={n_tokens} "
            f"after a warm-up of {warmup} needs {needed:,}: use a smaller n_tokens or more data"
        )

    # The eval_batches layout, each row preceded by its warm-up: row r scores k ∈ [r·L, (r+1)·L).
    row_len = -(-n_tokens // min(batch_size, n_tokens))
    rows = -(-n_tokens // row_len)
    width = warmup + -(-row_len // seg) * seg
    tokens = np.zeros((rows, width + 1), np.int32)  # zero padding lies after every scored target
    for r in range(rows):
        piece = stream.read(r * row_len, min(r * row_len + width + 1, len(stream)))
        tokens[r, : len(piece)] = piece
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    eval_model = with_config(model, dataclasses.replace(model.config, same_length=same_length))
    graphdef, state = nnx.split(eval_model)
    segments = {  # [S, B, T]
        "inputs": inputs.reshape(rows, -1, seg).swapaxes(0, 1),
        "targets": targets.reshape(rows, -1, seg).swapaxes(0, 1),
    }
    result = {}
    for context in contexts:
        mems = eval_model.init_mems(rows, int(context), keys_values=True)
        losses = np.asarray(segment_losses(graphdef, state, segments, mems))
        scored = losses[warmup // seg :].swapaxes(0, 1).reshape(rows, -1)  # after the warm-up
        result[int(context)] = scored[:, :row_len].reshape(-1)[:n_tokens]
    return result
