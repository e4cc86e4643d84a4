"""Dividing a corpus of files into train / valid / test that a reader can trust.

Three rules, each with its reason:

1. **Near-duplicates stay on one side.** Files whose sets of distinct lines overlap by a Jaccard
   index of ``NEAR_DUPLICATE`` or more are one group (transitively), and every file of a group of
   two or more goes to train. The standard library's generated codec tables (``encodings/cp*.py``,
   about a hundred files from one template) would otherwise put a file in test whose siblings the
   model has memorised, and test would be easier than valid.
2. **Valid and test are equally hard.** The remaining files, ordered by how well zlib compresses
   them (bits per byte, a model-free difficulty), are dealt out in proportion to each split's
   target, so that every split draws from every part of the difficulty range.
3. **Held-out splits are large enough and not dominated by one file.** Valid and test each take
   ``targets`` bytes (test: 64 windows of 32,768 bytes, the longest evaluation, with a margin);
   a file larger than ``LARGEST_HELD_OUT`` stays in train.

Deterministic: the same files give the same partition on every machine.
"""

from __future__ import annotations

import collections
import itertools
import zlib
from collections.abc import Mapping, Sequence

NEAR_DUPLICATE = 0.3  # Jaccard index of two files' distinct lines
SHORTEST_LINE = 8  # shorter lines ("else:", "return") say nothing about duplication
COMMON_LINE = 200  # a line in more files than this is boilerplate ("import os"), not a duplicate
LARGEST_HELD_OUT = 128 * 1024  # bytes; larger files stay in train
TARGETS = {"valid": 1_100_000, "test": 2_200_000}  # bytes; test ≥ 64 × 32,768 with a margin


def distinct_lines(text: bytes) -> frozenset[bytes]:
    return frozenset(
        line for line in (raw.strip() for raw in text.splitlines()) if len(line) >= SHORTEST_LINE
    )


def near_duplicate_groups(texts: Sequence[bytes], threshold: float = NEAR_DUPLICATE) -> list[int]:
    """The group of each text (an index: texts of one group share it): texts whose distinct lines
    have a Jaccard index ≥ ``threshold``, joined transitively."""
    lines = [distinct_lines(t) for t in texts]
    holders = collections.defaultdict(list)
    for index, text_lines in enumerate(lines):
        for line in text_lines:
            holders[line].append(index)
    shared = collections.Counter()
    for indices in holders.values():
        if len(indices) <= COMMON_LINE:
            shared.update(itertools.combinations(indices, 2))
    parent = list(range(len(texts)))

    def root(i: int) -> int:
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    for (a, b), common in shared.items():
        if common / len(lines[a] | lines[b]) >= threshold:
            parent[max(root(a), root(b))] = min(root(a), root(b))
    return [root(i) for i in range(len(texts))]


def bits_per_byte(text: bytes) -> float:
    """zlib's compressed size (level 9) in bits per byte: a model-free difficulty."""
    return 8 * len(zlib.compress(text, 9)) / max(len(text), 1)


def assign(texts: Mapping[str, bytes], targets: Mapping[str, int] = TARGETS) -> dict[str, str]:
    """The split ("train" or a key of ``targets``) of each named text, by the module's rules."""
    names = sorted(texts)
    groups = near_duplicate_groups([texts[n] for n in names])
    sizes = collections.Counter(groups)
    split = {n: "train" for n in names}
    candidates = [
        n
        for n, g in zip(names, groups, strict=True)
        if sizes[g] == 1 and len(texts[n]) <= LARGEST_HELD_OUT
    ]
    candidates.sort(key=lambda n: (bits_per_byte(texts[n]), n))
    total = sum(len(texts[n]) for n in candidates)
    if total <= sum(targets.values()):
        raise ValueError(
            f"partition.assign: {total:,} bytes of distinct files cannot hold held-out splits of "
            f"{sum(targets.values()):,} bytes and leave any for training"
        )
    share = {
        "train": 1 - sum(targets.values()) / total,
        **{s: b / total for s, b in targets.items()},
    }
    taken = dict.fromkeys(share, 0)
    dealt = 0
    for name in candidates:  # each split in turn takes what it lags behind its share most
        dealt += len(texts[name])
        chosen = max(share, key=lambda s: (share[s] * dealt - taken[s], s))
        split[name] = chosen
        taken[chosen] += len(texts[name])
    return split
