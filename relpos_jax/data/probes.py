"""Synthetic memory probes: byte streams whose answers lie a chosen distance back.

``data.name = "probe:<kind>:<distance>"`` trains on them through the same tfds/grain pipeline as any
corpus (documents concatenated, one contiguous stream per batch row); ``probe_accuracy`` scores a
model on fresh documents, teacher-forced, only at the answer bytes. ``probe:<kind>:<shortest>-<longest>``
mixes distances, each document drawing its own: short ones inside the segment are where a mechanism
is learned quickly, long ones beyond it are where only memory can answer. Kinds:

* ``passkey`` — "The pass key is 48213." then filler, then "What is the pass key? The pass key is
  48213." (Mohtashami & Jaggi 2023): the 5 answer digits sit ``distance`` bytes after the key's.
* ``copy`` — a random lowercase string, then "|", then the same string: each copied letter sits
  ``distance`` bytes after its original (the string has ``distance − 1`` letters).
* ``needle`` — one digit in filler text, "key 7. … key?7": the question mark and the digits occur
  nowhere else, so a single attention hop by content finds the answer ``distance`` bytes back. The
  quickest mechanism to learn: the probe that shows memory at laptop scale.
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

KINDS = ("passkey", "copy", "recall", "needle")
VERSION = 1  # bump when a generator changes: built datasets are keyed by it
FILLER = (
    b"The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again. "
)
SPLIT_SEEDS = {"train": 0, "valid": 1, "test": 2}
SPLIT_BYTES = {"train": 4_000_000, "valid": 200_000, "test": 200_000}
CHANCE = {"passkey": 0.1, "copy": 1 / 26, "recall": 0.1, "needle": 0.1}
# the shortest distance each kind can lay out (the passkey's question alone is 38 bytes)
MIN_DISTANCE = {"passkey": 64, "copy": 16, "recall": 16, "needle": 8}


class Document(NamedTuple):
    text: bytes
    answer: np.ndarray  # bool [len(text)]: the bytes a probe scores


def parse(name: str) -> tuple[str, int, int]:
    """``"probe:passkey:512"`` → ``("passkey", 512, 512)``; ``"probe:needle:8-96"`` → ``("needle", 8,
    96)``, a mixture whose documents draw their distance uniformly from 8 … 96; or a one-line
    DataError."""
    parts = name.split(":")
    fix = (
        f"use probe:<kind>:<distance> or probe:<kind>:<shortest>-<longest> with kind in {KINDS} "
        f"and distances of at least {MIN_DISTANCE} for that kind, e.g. probe:passkey:256"
    )
    if len(parts) != 3 or parts[0] != "probe" or parts[1] not in KINDS:
        raise DataError(f"data.name={name!r} is invalid; {fix}")
    bounds = parts[2].split("-")
    if not 1 <= len(bounds) <= 2 or not all(b.isdigit() for b in bounds):
        raise DataError(f"data.name={name!r} is invalid; {fix}")
    shortest, longest = int(bounds[0]), int(bounds[-1])
    if shortest < MIN_DISTANCE[parts[1]] or longest < shortest:
        raise DataError(f"data.name={name!r} is invalid; {fix}")
    return parts[1], shortest, longest


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


def needle(distance: int, rng: np.random.Generator) -> Document:
    digit = str(rng.integers(10)).encode()
    # the key digit -> the answer digit: ". ", filler, "key?" = distance bytes
    gap = distance - 1 - len(b". ") - len(b"key?")
    head = _filler(int(rng.integers(0, 16)), rng) + b"key "
    return _with_answer(
        [
            (head + digit + b". " + _filler(gap, rng) + b"key?", False),
            (digit, True),
            (b"\n", False),
        ]
    )


MAKERS = {"passkey": passkey, "copy": copy, "recall": recall, "needle": needle}


def documents(kind: str, distance: int, count: int, seed: int) -> list[Document]:
    rng = np.random.default_rng([seed, distance, KINDS.index(kind)])
    return [MAKERS[kind](distance, rng) for _ in range(count)]


def split_stream(name: str, split: str):
    """Byte pieces of ``split`` of probe ``name`` (about 4 MB train, 200 kB valid and test)."""
    if split not in SPLITS:
        raise DataError(f"split={split!r} is invalid; use one of {SPLITS}")
    kind, shortest, longest = parse(name)
    seed = [SPLIT_SEEDS[split], shortest, KINDS.index(kind)]
    rng = np.random.default_rng(seed if shortest == longest else [*seed, longest])
    written = 0
    while written < SPLIT_BYTES[split]:
        distance = shortest if shortest == longest else int(rng.integers(shortest, longest + 1))
        text = MAKERS[kind](distance, rng).text
        written += len(text)
        yield text
