"""The corpus partition: near-duplicates on one side, valid and test equally hard and large enough
(``relpos_jax/data/partition.py``), on synthetic files and on the embedded standard library."""

from __future__ import annotations

import collections
import pathlib
import random
import sysconfig

import pytest

from relpos_jax.data import corpora, partition

WINDOW = 32_768  # the longest evaluation length
SMALL = {"valid": 20_000, "test": 20_000}


def _file(rng: random.Random, words: int) -> bytes:
    vocabulary = [f"name_{i}" for i in range(400)]
    lines = (
        f"    {rng.choice(vocabulary)} = {rng.choice(vocabulary)}({rng.randrange(10**6)})"
        for _ in range(words)
    )
    return "\n".join(lines).encode()


def _family(rng: random.Random, count: int) -> dict[str, bytes]:
    """``count`` files from one template: the same 200 table lines, 20 of their own."""
    table = _file(rng, 200)
    return {f"codecs/table_{i:02d}.py": table + b"\n" + _file(rng, 20) for i in range(count)}


def _corpus(seed: int = 0) -> dict[str, bytes]:
    rng = random.Random(seed)
    texts = {f"module_{i:03d}.py": _file(rng, rng.randrange(20, 200)) for i in range(120)}
    return texts | _family(rng, 12)


def test_near_duplicates_are_one_group_and_distinct_files_are_not():
    texts = _corpus()
    names = sorted(texts)
    groups = collections.Counter(partition.near_duplicate_groups([texts[n] for n in names]))
    assert sorted(groups.values(), reverse=True)[:2] == [12, 1]


def test_near_duplicates_stay_in_train_and_held_out_splits_reach_their_targets():
    texts = _corpus()
    split = partition.assign(texts, SMALL)
    assert all(split[n] == "train" for n in texts if n.startswith("codecs/"))
    sizes = collections.Counter()
    for name, where in split.items():
        sizes[where] += len(texts[name])
    for held_out, target in SMALL.items():
        assert abs(sizes[held_out] - target) < 6_000  # within a file of the target
    assert partition.assign(texts, SMALL) == split  # deterministic


def test_valid_and_test_are_dealt_across_the_difficulty_range():
    rng = random.Random(1)
    easy = {f"easy_{i:03d}.py": b"x = 1\n" * rng.randrange(200, 400) for i in range(60)}
    hard = {f"hard_{i:03d}.py": rng.randbytes(rng.randrange(1_000, 2_000)) for i in range(60)}
    split = partition.assign(easy | hard, {"valid": 20_000, "test": 20_000})
    for held_out in SMALL:
        kinds = collections.Counter(n.split("_")[0] for n, s in split.items() if s == held_out)
        assert kinds["easy"] >= 5 and kinds["hard"] >= 5, (held_out, kinds)


def test_a_corpus_too_small_for_its_held_out_splits_is_refused():
    with pytest.raises(ValueError, match="cannot hold held-out splits"):
        partition.assign(_corpus(), {"valid": 10**7, "test": 10**7})


def test_pystdlib_partition_keeps_near_duplicates_out_of_test_with_equal_difficulty():
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    texts = {p.relative_to(root).as_posix(): p.read_bytes() for p in corpora.pystdlib_files()}
    joined = {
        split: b"".join(texts[n] for n in sorted(texts) if corpora.split_of(n) == split)
        for split in corpora.SPLITS
    }
    assert len(joined["test"]) >= 64 * WINDOW and len(joined["valid"]) >= 32 * WINDOW
    difficulty = {s: partition.bits_per_byte(joined[s]) for s in ("valid", "test")}
    assert abs(difficulty["valid"] - difficulty["test"]) < 0.05, difficulty
    lines = {n: partition.distinct_lines(t) for n, t in texts.items()}
    train = [n for n in texts if corpora.split_of(n) == "train"]
    for name in texts:
        if corpora.split_of(name) != "train" and lines[name]:
            closest = max(len(lines[name] & lines[t]) / len(lines[name] | lines[t]) for t in train)
            assert closest < partition.NEAR_DUPLICATE, name
    assert corpora.split_of("encodings/cp1026.py") == "train"  # the hash partition's test held it
    assert corpora.split_of("encodings/cp1026.py", "hash") == "test"


def test_an_unknown_partition_is_one_line_naming_the_field():
    with pytest.raises(corpora.DataError, match=r"data.partition='random' is invalid; use one of"):
        next(corpora.split_stream("pystdlib", None, "test", "random"))
