"""Memory probes scored: accuracy at the answer bytes, and accuracy against distance.

``probe_accuracy(model, "probe:passkey:256", segment_len=64, mem_len=128)`` lays fresh documents
(``data.probes``) out in ``batch_size`` rows of whole documents, runs the model over each row segment by
segment with its memory carried, and scores, teacher-forced, only the answer bytes: the fraction of
answer bytes predicted (argmax), and the fraction of documents whose answer is entirely right.

As the rows run on, an answer's key (the byte ``distance`` back) falls in an earlier segment for some
answers: beyond the first layer's reach when it lies before the memory too. ``reachable`` is the
share of answers whose key is within reach (the segment so far and ``mem_len`` positions before it);
``reachable_only=True`` scores only those, the accuracy of a model "with the key in its window".
For ``recall`` the byte ``distance`` back is the end of the listing, so its pair lies further still:
there, within reach is necessary, not sufficient.
"""

from __future__ import annotations

import functools
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from relpos_jax.data import probes
from relpos_jax.memory import scan_segments
from relpos_jax.model import TransformerLM


def predictions(logits: jax.Array, segment: jax.Array) -> jax.Array:
    """The readout of ``predict``: the most likely next byte at each position ``[B, T]``."""
    return jnp.argmax(logits, axis=-1)


@functools.partial(jax.jit, static_argnums=0)
def predict(graphdef, state, segments: jax.Array, mems) -> jax.Array:
    """The argmax predictions ``[S, B, T]`` over S consecutive segments ``[S, B, T]``, the memory
    carried from each to the next."""
    return scan_segments(nnx.merge(graphdef, state), segments, mems, predictions)[0]


def _rows(docs: list[probes.Document], batch_size: int, segment_len: int):
    """Whole documents dealt to rows; rows padded to whole segments (padding is never scored)."""
    rows = [docs[r::batch_size] for r in range(min(batch_size, len(docs)))]
    texts = [b"".join(d.text for d in row) for row in rows]
    length = -(-(max(map(len, texts)) - 1) // segment_len) * segment_len + 1
    tokens = np.zeros((len(rows), length), np.int32)
    answer = np.zeros((len(rows), length), bool)
    doc_id = np.full((len(rows), length), -1, np.int64)
    for r, row in enumerate(rows):
        tokens[r, : len(texts[r])] = np.frombuffer(texts[r], np.uint8)
        answer[r, : len(texts[r])] = np.concatenate([d.answer for d in row])
        ids = [r + batch_size * i for i in range(len(row))]
        doc_id[r, : len(texts[r])] = np.repeat(ids, [len(d.text) for d in row])
    return tokens, answer, doc_id


def probe_accuracy(
    model: TransformerLM,
    name: str,
    *,
    segment_len: int,
    mem_len: int,
    documents: int = 64,
    batch_size: int = 8,
    seed: int = 3,
    reachable_only: bool = False,
) -> dict[str, Any]:
    """Teacher-forced accuracy of ``model`` on fresh documents of probe ``name``: over every answer
    byte, or with ``reachable_only`` over those whose key is within reach (``byte_accuracy`` None
    where none is)."""
    kind, distance, longest = probes.parse(name)
    if longest != distance:
        raise probes.DataError(
            f"probe={name!r} is invalid for scoring; score one distance at a time "
            f"(accuracy_by_distance(model, {kind!r}, [{distance}, …, {longest}]))"
        )
    docs = probes.documents(kind, distance, documents, seed)
    tokens, answer, doc_id = _rows(docs, batch_size, segment_len)
    graphdef, state = nnx.split(model)
    mems = model.init_mems(tokens.shape[0], mem_len, keys_values=True)
    rows, length = tokens.shape[0], tokens.shape[1] - 1  # a whole number of segments
    segments = tokens[:, :length].reshape(rows, -1, segment_len).swapaxes(0, 1)  # [S, B, T]
    predicted = np.asarray(predict(graphdef, state, jnp.asarray(segments), mems))
    predicted = predicted.swapaxes(0, 1).reshape(rows, length)
    correct = predicted == tokens[:, 1:]
    answers = answer[:, 1:]  # target j is token j + 1
    reachable = answers & within_reach(length, distance, segment_len, mem_len)
    scored = reachable if reachable_only else answers
    targets = doc_id[:, 1:]
    counted_docs = len(np.unique(targets[scored]))
    wrong_docs = len(np.unique(targets[scored & ~correct]))
    return {
        "probe": name,
        "kind": kind,
        "distance": distance,
        "byte_accuracy": float(correct[scored].mean()) if scored.any() else None,
        "document_accuracy": 1.0 - wrong_docs / counted_docs if counted_docs else None,
        "chance": probes.CHANCE[kind],
        "documents": len(docs),
        "segment_len": segment_len,
        "mem_len": mem_len,
        "reachable": float(reachable.sum() / answers.sum()),
        "reachable_only": reachable_only,
    }


def within_reach(length: int, distance: int, segment_len: int, mem_len: int) -> np.ndarray:
    """Whether the byte ``distance`` before each of ``length`` targets (target j is token j + 1,
    predicted at position j) lies within the first layer's reach ``[length]``: the positions of
    j's segment up to j and the ``mem_len`` before that segment."""
    offset = np.arange(length) % segment_len  # j's offset in its segment
    return distance <= offset + 1 + mem_len


def accuracy_by_distance(
    model: TransformerLM, kind: str, distances, **settings
) -> list[dict[str, Any]]:
    """``probe_accuracy`` at each distance: the curve that shows how far back memory reaches."""
    return [probe_accuracy(model, f"probe:{kind}:{d}", **settings) for d in distances]
