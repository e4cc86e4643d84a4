"""Token streams and the Transformer-XL batching, read through grain.

Training (``train_dataset``): the split's stream of N tokens is cut into ``batch_size`` contiguous
streams, one per batch row, so that the memory a row carries from step t to t + 1 belongs to the text
that follows. Step t of an epoch gives each row the tokens ``[t·T, (t+1)·T]`` of its stream (inputs and
targets shifted by one). Deterministic, indexed by step (resumable from the grain iterator state), and
each process reads only its own rows.

Evaluation (``eval_batches``): every token of the split except the first is a target exactly once —
rows as above, the last partial segment included, padding weighted 0; with ``whole_segments``, rows
of whole segments, so that each segment starts at a multiple of T in the text.
Legend: B batch rows (this process's), T segment length.
"""

from __future__ import annotations

import dataclasses

import grain
import numpy as np

from relpos_jax.data.corpora import DataError


class TokenStream:
    """Random access to a split stored as fixed-size records of feature ``key`` (``bytes`` of a
    ``builders.ByteCorpus``, ``ids`` of a ``WordCorpus``); ``vocabulary`` is the word-level
    corpus's ``words.Vocabulary`` (None for bytes)."""

    vocabulary = None

    def __init__(self, source, chunk: int, key: str = "bytes", vocabulary=None):
        self.source, self.chunk, self.key, self.vocabulary = source, chunk, key, vocabulary
        count = len(source)
        self.length = 0 if count == 0 else (count - 1) * chunk + len(source[count - 1][key])

    def __len__(self) -> int:
        return self.length

    def read(self, start: int, stop: int) -> np.ndarray:
        first, last = start // self.chunk, (stop - 1) // self.chunk
        pieces = [np.asarray(self.source[i][self.key]) for i in range(first, last + 1)]
        joined = np.concatenate(pieces) if len(pieces) > 1 else pieces[0]
        offset = first * self.chunk
        return joined[start - offset : stop - offset]


class ArrayStream(TokenStream):
    """A stream held in memory (tests, generated corpora)."""

    def __init__(self, tokens: np.ndarray):
        self.tokens = np.asarray(tokens)
        self.length = len(self.tokens)

    def read(self, start: int, stop: int) -> np.ndarray:
        return self.tokens[start:stop]


@dataclasses.dataclass(frozen=True)
class RowLayout:
    """How a stream is cut into ``batch_size`` rows of ``steps`` segments of ``segment_len``."""

    length: int
    batch_size: int
    segment_len: int

    @property
    def row_len(self) -> int:  # tokens per row, +1 for the last target
        return (self.length - 1) // self.batch_size

    @property
    def steps(self) -> int:
        return self.row_len // self.segment_len


def _rows(process_index: int, process_count: int, batch_size: int) -> range:
    if batch_size % process_count:
        raise DataError(
            f"data.batch_size={batch_size} is invalid; it must be a multiple of the "
            f"{process_count} processes"
        )
    per_process = batch_size // process_count
    return range(process_index * per_process, (process_index + 1) * per_process)


def train_dataset(
    stream: TokenStream,
    batch_size: int,
    segment_len: int,
    *,
    process_index: int = 0,
    process_count: int = 1,
) -> grain.MapDataset:
    """Infinite dataset of ``{"inputs", "targets"}`` int32 ``[B, T]`` batches, item t = step t."""
    layout = RowLayout(len(stream), batch_size, segment_len)
    if layout.steps < 1:
        raise DataError(
            f"data.batch_size={batch_size} is invalid for a split of {len(stream):,} tokens with "
            f"segment_len {segment_len}: one batch needs {batch_size * segment_len + 1:,}; use a "
            "smaller batch_size or segment_len, or more data"
        )
    rows = _rows(process_index, process_count, batch_size)

    def batch(step: int) -> dict[str, np.ndarray]:
        t = step % layout.steps
        segments = np.stack(
            [
                stream.read(
                    r * layout.row_len + t * segment_len,
                    r * layout.row_len + (t + 1) * segment_len + 1,
                )
                for r in rows
            ]
        ).astype(np.int32)
        return {"inputs": segments[:, :-1], "targets": segments[:, 1:]}

    return grain.MapDataset.range(layout.steps).repeat().map(batch)


def eval_batches(
    stream: TokenStream,
    batch_size: int,
    segment_len: int,
    max_tokens: int | None = None,
    *,
    whole_segments: bool = False,
):
    """Yield ``{"inputs", "targets", "weights"}`` ``[B, T]``; weights sum to the scored token count.

    Targets are tokens 1 … N − 1 (or the first ``max_tokens`` of them), each exactly once: row r holds
    targets ``[r·L, (r+1)·L)`` with L = ceil(count / B). Rows are padded at their end to whole
    segments with weight 0 (after every real token, so causal attention never sees the padding).
    With ``whole_segments``, L is rounded up to whole segments (the batch may then have fewer rows):
    every segment starts at a multiple of ``segment_len`` in the text, so that the segments of one
    length nest in those of any multiple of it (without memory, only where they fall changes).
    """
    count = len(stream) - 1 if max_tokens is None else min(len(stream) - 1, max_tokens)
    if count < 1:
        raise DataError(f"data: the evaluation split has {len(stream)} tokens; it needs at least 2")
    row_len = -(-count // max(1, min(batch_size, count)))
    if whole_segments:
        row_len = -(-row_len // segment_len) * segment_len
    batch_size = -(-count // row_len)  # no empty rows
    steps = -(-row_len // segment_len)
    tokens = stream.read(0, count + 1).astype(np.int32)
    inputs = np.zeros((batch_size, steps * segment_len), np.int32)
    targets = np.zeros_like(inputs)
    weights = np.zeros(inputs.shape, np.float32)
    for r in range(batch_size):
        lo, hi = r * row_len, min((r + 1) * row_len, count)
        inputs[r, : hi - lo] = tokens[lo:hi]
        targets[r, : hi - lo] = tokens[lo + 1 : hi + 1]
        weights[r, : hi - lo] = 1.0
    for t in range(steps):
        window = slice(t * segment_len, (t + 1) * segment_len)
        yield {
            "inputs": inputs[:, window],
            "targets": targets[:, window],
            "weights": weights[:, window],
        }


def sliding_batches(
    stream: TokenStream, batch_size: int, window: int, stride: int, max_tokens: int | None = None
):
    """Yield ``{"inputs", "targets", "weights"}`` ``[B, window]``: the sliding-window protocol.

    Window k reads inputs ``[k·stride, k·stride + window)``; the first window scores all its targets,
    every later one only its last ``stride`` (each with ``window − stride`` or more tokens of
    context). Targets 1 … N − 1 (or the first ``max_tokens``) are scored exactly once. The last batch
    is padded with zero-weight windows so that every batch has the same shape.
    """
    if not 1 <= stride <= window:
        raise DataError(f"sliding_batches: stride={stride} is invalid; use 1 … window ({window})")
    count = len(stream) - 1 if max_tokens is None else min(len(stream) - 1, max_tokens)
    if count < 1:
        raise DataError(f"data: the evaluation split has {len(stream)} tokens; it needs at least 2")
    tokens = stream.read(0, count + 1).astype(np.int32)
    windows = 1 + max(0, -(-(count - window) // stride))
    offsets = np.arange(window)
    for first in range(0, windows, batch_size):
        starts = (first + np.arange(batch_size)) * stride
        index = starts[:, None] + offsets[None, :]  # [B, window] input positions
        scored = (index < count) & (np.arange(first, first + batch_size) < windows)[:, None]
        scored &= (offsets >= window - stride)[None, :] | (starts == 0)[:, None]
        clipped = np.minimum(index, count - 1)
        yield {
            "inputs": np.where(index < count, tokens[clipped], 0),
            "targets": np.where(index < count, tokens[clipped + 1], 0),
            "weights": scored.astype(np.float32),
        }
