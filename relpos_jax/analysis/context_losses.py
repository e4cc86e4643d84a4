"""Per-token losses of the same tokens at several context lengths: RECL's l_i(c, t), each model scored
as it was trained (``relpos_jax.analysis.recl`` computes RECL from them).

Two scorings of the same targets, with the same attention span per token:

- ``memory`` (``context_token_losses``), for a model trained with memory: the stream in segments of
  s tokens with a memory of c positions carried from segment to segment (the key/value memory, as
  ``evaluate`` scores). With ``same_length=False`` (what ``scoring_losses`` passes) the token at
  offset j ∈ [0, s) of its segment attends to the c + j positions before it at every layer; the
  memory states were themselves computed with memory, so older text reaches it through the
  recurrence (up to about L·(c + s) tokens back, L layers, as far as the warm-up goes).
- ``window`` (``window_token_losses``), for a model trained without memory: each segment of s targets
  from a fresh window of its c + s inputs (the c before the segment, then its own s), no memory,
  positions from 0 at the window's start; only its last s are scored. The token at offset j sees
  exactly the c + j tokens before it and nothing older: a vanilla sliding window with stride s.
  A model with absolute positions (``trained_window``) never saw a position past its training
  window W: its windows stop growing at W (context min(c, W − s)), as a vanilla Transformer is
  evaluated, so that positions it never trained on are not scored as context it failed to use.

So at every c a token at offset j attends to c + j earlier tokens in both scorings (between c and
c + s − 1); what the memory scoring adds is the recurrence, which is what the memory model was
trained to use. At c = 0 the two are the same computation (segments without memory).

Which tokens: the stream is cut into rows as ``evaluate`` cuts it (``batch_size`` rows, each scoring
⌈n_tokens / rows⌉ consecutive targets: the rows fix which tokens are scored), each row preceded by a warm-up of W = ⌈max(contexts) / s⌉
segments, so every memory is full and every window has its c tokens when scoring starts. Scored:
the targets after the warm-up, row by row; the same for every context, every model and both
scorings, as RECL's group needs. Legend: S segments, B rows, T segment length (s).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Sequence

import jax
import numpy as np
from flax import nnx

from relpos_jax import data as data_lib
from relpos_jax.evaluate import with_config
from relpos_jax.memory import scan_segments
from relpos_jax.model import TransformerLM

MEMORY, WINDOW = "memory", "window"
SCORINGS = (MEMORY, WINDOW)


def scoring_for(mem_len: int) -> str:
    """How a model trained with memory ``mem_len`` is scored: with memory, or in windows (0)."""
    return MEMORY if mem_len > 0 else WINDOW


def trained_window(cfg) -> int | None:
    """The longest window a model of ``cfg`` (a ``Config`` or its ConfigDict) trained without memory
    is scored with: its training window (``data.segment_len``) where its positions are absolute (its
    scheme adds them to the embeddings: a later position was never trained), else None (any
    length)."""
    from relpos_jax import schemes

    absolute = schemes.overrides(schemes.get(cfg.model.position), "embed")
    return cfg.data.segment_len if absolute and cfg.model.mem_len == 0 else None


def _negated(log_probs: jax.Array, segment: dict) -> jax.Array:
    return -log_probs


@functools.partial(jax.jit, static_argnums=0)
def segment_losses(graphdef, state, segments: dict, mems):
    """Per-token losses ``[S, B, T]`` (nats) of S consecutive segments ``segments["inputs" |
    "targets"]``, the memory carried from each to the next."""
    model = nnx.merge(graphdef, state)
    return scan_segments(model, segments, mems, _negated, targets=True)[0]


@functools.partial(jax.jit, static_argnums=0)
def window_losses(graphdef, state, inputs, targets):
    """Per-token losses ``[B, W]`` (nats) of windows ``inputs [B, W]`` scored without memory."""
    model = nnx.merge(graphdef, state)
    log_probs, _ = model.target_log_probs(
        inputs, targets, model.init_mems(inputs.shape[0], 0, keys_values=True)
    )
    return -log_probs


@dataclasses.dataclass(frozen=True)
class _Layout:
    """The scored tokens: ``tokens [rows, width + 1]``, each row's warm-up then its scored part."""

    tokens: np.ndarray
    warmup: int
    row_len: int
    n_tokens: int
    seg: int

    @property
    def rows(self) -> int:
        return self.tokens.shape[0]

    @property
    def segments(self) -> int:
        """Scored segments per row (the last may hold targets past the row's share: not kept)."""
        return -(-self.row_len // self.seg)

    def scored(self, losses_BX: np.ndarray) -> np.ndarray:
        """``[n_tokens]``: each row's scored losses ``[rows, ≥ row_len]``, row by row."""
        return losses_BX[:, : self.row_len].reshape(-1)[: self.n_tokens]


def _layout(caller, stream_or_tokens, contexts, segment_len, n_tokens, batch_size) -> _Layout:
    contexts = list(contexts)
    if not contexts or any(
        isinstance(c, bool) or not isinstance(c, int | np.integer) or c < 0 for c in contexts
    ):
        raise ValueError(f"{caller}: contexts={contexts!r} is invalid; pass context lengths >= 0")
    if any(b <= a for a, b in itertools.pairwise(contexts)):
        raise ValueError(
            f"{caller}: contexts={contexts!r} are not increasing; pass them in ascending order, "
            "each once"
        )
    sizes = {"segment_len": segment_len, "n_tokens": n_tokens, "batch_size": batch_size}
    for name, value in sizes.items():
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{caller}: {name}={value!r} is invalid; use an int >= 1")
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
            f"{caller}: the stream has {len(stream):,} tokens; n_tokens={n_tokens} after a warm-up "
            f"of {warmup} needs {needed:,}: use a smaller n_tokens or more data"
        )
    # The eval_batches layout, each row preceded by its warm-up: row r scores k ∈ [r·L, (r+1)·L).
    row_len = -(-n_tokens // min(batch_size, n_tokens))
    rows = -(-n_tokens // row_len)
    width = warmup + -(-row_len // seg) * seg
    tokens = np.zeros((rows, width + 1), np.int32)  # zero padding lies after every scored target
    for r in range(rows):
        piece = stream.read(r * row_len, min(r * row_len + width + 1, len(stream)))
        tokens[r, : len(piece)] = piece
    return _Layout(tokens, warmup, row_len, n_tokens, seg)


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
    """{context: per-token losses [n_tokens]} of the scored tokens, with ``mem_len = context``.

    ``same_length=False`` (the ``memory`` scoring): a query at offset j of its segment attends to
    ``context + j`` earlier positions, and ``context`` 0 is plain evaluation without memory.
    ``same_length=True`` (what the paper's evaluation scripts pass) makes every query attend to
    exactly ``context`` earlier positions plus itself at every layer, wherever it sits in its
    segment; ``context`` 0 is then the model given the current token alone. Either way the memory
    states carry older information: this measures the context the model can use through an
    attention span of ``context``, not a from-scratch window (for one layer the two coincide).
    """
    layout = _layout(
        "context_token_losses", stream_or_tokens, contexts, segment_len, n_tokens, batch_size
    )
    seg, rows = layout.seg, layout.rows
    inputs, targets = layout.tokens[:, :-1], layout.tokens[:, 1:]
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
        after_warmup = losses[layout.warmup // seg :].swapaxes(0, 1).reshape(rows, -1)
        result[int(context)] = layout.scored(after_warmup)
    return result


def window_token_losses(
    model: TransformerLM,
    stream_or_tokens: data_lib.TokenStream | np.ndarray,
    contexts: Sequence[int],
    *,
    segment_len: int,
    n_tokens: int,
    batch_size: int,
    windows_per_call: int | None = None,
    longest_window: int | None = None,
) -> dict[int, np.ndarray]:
    """{context: per-token losses [n_tokens]} of the scored tokens (those of
    ``context_token_losses`` with the same ``segment_len``, ``n_tokens`` and ``batch_size`` rows),
    each segment of ``segment_len`` targets from a fresh window of the ``context + segment_len``
    inputs that end with it, without memory; ``windows_per_call`` (default ``batch_size``) windows
    a compiled call, one compilation per context. ``longest_window`` (``trained_window``; None: no
    limit) caps the windows: a context past ``longest_window − segment_len`` is scored as that one."""
    layout = _layout(
        "window_token_losses", stream_or_tokens, contexts, segment_len, n_tokens, batch_size
    )
    seg, first = layout.seg, layout.warmup // layout.seg
    per_call = batch_size if windows_per_call is None else windows_per_call
    if isinstance(per_call, bool) or not isinstance(per_call, int) or per_call < 1:
        raise ValueError(
            f"window_token_losses: windows_per_call={per_call!r} is invalid; use an int >= 1"
        )
    if longest_window is not None and (
        isinstance(longest_window, bool) or not isinstance(longest_window, int)
        or longest_window < seg
    ):  # fmt: skip
        raise ValueError(
            f"window_token_losses: longest_window={longest_window!r} is invalid; use None or an "
            f"int >= segment_len ({seg})"
        )
    eval_model = with_config(model, dataclasses.replace(model.config, same_length=False))
    graphdef, state = nnx.split(eval_model)
    # Where each scored segment's inputs start in its row: (row, offset), row by row.
    starts = [(r, (first + i) * seg) for r in range(layout.rows) for i in range(layout.segments)]
    by_context: dict[int, np.ndarray] = {}  # the losses of each context scored
    result = {}
    for context in contexts:
        c = int(context) if longest_window is None else min(int(context), longest_window - seg)
        if c in by_context:  # capped: the longest window's losses again
            result[int(context)] = by_context[c]
            continue
        windows = np.stack([layout.tokens[r, p - c : p + seg + 1] for r, p in starts])
        losses = np.empty((len(windows), seg), np.float32)
        for k in range(0, len(windows), per_call):
            chunk = windows[k : k + per_call]
            padded = np.concatenate([chunk, np.repeat(chunk[-1:], per_call - len(chunk), 0)])
            scores = window_losses(graphdef, state, padded[:, :-1], padded[:, 1:])  # one shape
            losses[k : k + len(chunk)] = np.asarray(scores)[: len(chunk), c:]
        result[int(context)] = by_context[c] = layout.scored(losses.reshape(layout.rows, -1))
    return result


def scoring_losses(
    model: TransformerLM,
    stream_or_tokens: data_lib.TokenStream | np.ndarray,
    contexts: Sequence[int],
    *,
    scoring: str,
    segment_len: int,
    n_tokens: int,
    batch_size: int,
    longest_window: int | None = None,
) -> dict[int, np.ndarray]:
    """The per-token losses of ``scoring`` (``memory`` or ``window``, see the module docstring;
    ``longest_window`` caps the windows)."""
    options = {"segment_len": segment_len, "n_tokens": n_tokens, "batch_size": batch_size}
    if scoring == MEMORY:
        return context_token_losses(model, stream_or_tokens, contexts, same_length=False, **options)
    if scoring == WINDOW:
        return window_token_losses(
            model, stream_or_tokens, contexts, longest_window=longest_window, **options
        )
    raise ValueError(f"scoring_losses: scoring={scoring!r} is invalid; use one of {SCORINGS}")
