"""Synthetic memory probes: byte streams whose answers lie a chosen distance back.

``data.name = "probe:<kind>:<distance>"`` trains on them through the same tfds/grain pipeline as any
corpus (documents concatenated, one contiguous stream per batch row); ``probe_accuracy`` scores a
model on fresh documents, teacher-forced, only at the answer bytes. Kinds:

* ``passkey`` — "The pass key is 48213." then filler, then "What is the pass key? The pass key is
  48213." (Mohtashami & Jaggi 2023): the 5 answer digits sit ``distance`` bytes after the key's.
* ``copy`` — a random lowercase string, then "|", then the same string: each copied letter sits
  ``distance`` bytes after its original (the string has ``distance − 1`` letters).
* ``recall`` — associative recall: 8 pairs "ab=3 cd=7 …", filler, then the query "ab?" and its digit;
  the answer is ``distance`` bytes after the end of the list (so at least that far from its pair).

A model whose window (segment plus memory) is shorter than ``distance`` can only guess: 1/10 per digit
for passkey and recall, 1/26 per letter for copy.
"""

from __future__ import annotations

import string
from typing import NamedTuple

import numpy as np

from relpos_jax.data.corpora import SPLITS, DataError

KINDS = ("passkey", "copy", "recall")
VERSION = 1  # bump when a generator changes: built datasets are keyed by it
FILLER = (
    b"The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
)
SPLIT_SEEDS = {"train": 0, "valid": 1, "test": 2}
SPLIT_BYTES = {"train": 4_000_000, "valid": 200_000, "test": 200_000}
CHANCE = {"passkey": 0.1, "copy": 1 / 26, "recall": 0.1}
MIN_DISTANCE = 64  # the passkey sentence itself is 45 bytes


class Document(NamedTuple):
    text: bytes
    answer: np.ndarray  # bool [len(text)]: the bytes a probe scores


def parse(name: str) -> tuple[str, int]:
    """``"probe:passkey:512"`` → ``("passkey", 512)``, or a one-line DataError."""
    parts = name.split(":")
    fix = (
        f"use probe:<kind>:<distance> with kind in {KINDS} and a distance ≥ {MIN_DISTANCE}, "
        "e.g. probe:passkey:256"
    )
    if len(parts) != 3 or parts[0] != "probe" or parts[1] not in KINDS or not parts[2].isdigit():
        raise DataError(f"data.name={name!r} is invalid; {fix}")
    if int(parts[2]) < MIN_DISTANCE:
        raise DataError(f"data.name={name!r} is invalid; {fix}")
    return parts[1], int(parts[2])


def _filler(n: int, rng: np.random.Generator) -> bytes:
    start = int(rng.integers(len(FILLER)))
    return (FILLER * (n // len(FILLER) + 2))[start : start + n]


def _with_answer(pieces: list[tuple[bytes, bool]]) -> Document:
    text = b"".join(p for p, _ in pieces)
    answer = np.concatenate([np.full(len(p), scored) for p, scored in pieces])
    return Document(text, answer)


def passkey(distance: int, rng: np.random.Generator) -> Document:
    key = "".join(rng.choice(list(string.digits), 5)).encode()
    question = b"What is the pass key? The pass key is "
    # first key digit -> first answer digit: key, ". ", filler, question = distance bytes
    gap = distance - len(key) - 2 - len(question)
    head = _filler(int(rng.integers(0, 40)), rng) + b"The pass key is "
    return _with_answer(
        [
            (head + key + b". " + _filler(gap, rng) + question, False),
            (key, True),
            (b".\n", False),
        ]
    )


def copy(distance: int, rng: np.random.Generator) -> Document:
    letters = bytes(rng.choice(list(string.ascii_lowercase.encode()), distance - 1).tolist())
    return _with_answer([(b"copy: " + letters + b"|", False), (letters, True), (b"\n", False)])


def recall(distance: int, rng: np.random.Generator, pairs: int = 8) -> Document:
    names = [a + b for a in string.ascii_lowercase for b in string.ascii_lowercase]
    keys = rng.choice(names, pairs, replace=False)
    values = rng.choice(list(string.digits), pairs)
    listing = b"pairs: " + b"".join(f"{k}={v} ".encode() for k, v in zip(keys, values, strict=True))
    q = int(rng.integers(pairs))
    query = f"{keys[q]}?".encode()
    # end of the listing -> the answer: filler and query = distance bytes
    return _with_answer(
        [
            (listing + _filler(distance - len(query), rng) + query, False),
            (values[q].encode(), True),
            (b"\n", False),
        ]
    )


MAKERS = {"passkey": passkey, "copy": copy, "recall": recall}


def documents(kind: str, distance: int, count: int, seed: int) -> list[Document]:
    rng = np.random.default_rng([seed, distance, KINDS.index(kind)])
    return [MAKERS[kind](distance, rng) for _ in range(count)]


def split_stream(name: str, split: str):
    """Byte pieces of ``split`` of probe ``name`` (about 4 MB train, 200 kB valid and test)."""
    if split not in SPLITS:
        raise DataError(f"split={split!r} is invalid; use one of {SPLITS}")
    kind, distance = parse(name)
    rng = np.random.default_rng([SPLIT_SEEDS[split], distance, KINDS.index(kind)])
    written = 0
    while written < SPLIT_BYTES[split]:
        text = MAKERS[kind](distance, rng).text
        written += len(text)
        yield text
