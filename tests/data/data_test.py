"""Corpora, builders and the Transformer-XL batching: contiguous rows, every eval token once."""

from __future__ import annotations

import numpy as np
import pytest

from relpos_jax import data
from relpos_jax.data import builders, corpora, pipeline


@pytest.fixture(scope="module")
def text_corpus(tmp_path_factory):
    """A generated corpus: structured lines plus bytes that are not valid UTF-8."""
    root = tmp_path_factory.mktemp("corpus")
    rng = np.random.default_rng(0)
    lines = [f"def f{i}(x):\n    return x * {i} + {rng.integers(100)}\n" for i in range(1500)]
    payload = "".join(lines).encode() + bytes([0xFF, 0xFE, 0x80, 0x00]) * 50
    (root / "a.txt").write_bytes(payload[: len(payload) // 2])
    (root / "b.txt").write_bytes(payload[len(payload) // 2 :])
    return root, payload


def _stream(text_corpus, split, tmp_path):
    root, _ = text_corpus
    return data.open_split("text", split, path=str(root), data_dir=str(tmp_path))


def test_text_corpus_round_trips_every_byte(text_corpus, tmp_path):
    _, payload = text_corpus
    streams = [_stream(text_corpus, split, tmp_path) for split in corpora.SPLITS]
    joined = np.concatenate([s.read(0, len(s)) for s in streams])
    assert joined.tobytes() == payload  # non-UTF-8 bytes included: byte-level simply works
    assert abs(len(streams[0]) / len(payload) - 0.9) < 0.01


def test_stream_reads_across_record_boundaries():
    chunk = 8
    tokens = np.arange(50, dtype=np.uint8)
    records = [{"bytes": tokens[i : i + chunk]} for i in range(0, 50, chunk)]
    stream = pipeline.TokenStream(records, chunk)
    assert len(stream) == 50
    for start, stop in [(0, 50), (7, 9), (8, 16), (15, 41), (48, 50)]:
        np.testing.assert_array_equal(stream.read(start, stop), tokens[start:stop])


def test_pystdlib_excludes_tests_and_splits_by_file():
    files = corpora.pystdlib_files()
    assert len(files) > 100
    assert not any("test" in p.parts or "tests" in p.parts for p in files)
    splits = {corpora._split_of(p.name) for p in files}
    assert splits == {"train", "valid", "test"}
    assert corpora.pystdlib_name().startswith("pystdlib_py3")


def test_train_rows_are_contiguous_streams_across_steps():
    tokens = np.arange(1000) % 256
    stream = pipeline.ArrayStream(tokens)
    dataset = data.train_dataset(stream, batch_size=4, segment_len=10)
    row_len = (1000 - 1) // 4
    for step in range(5):
        batch = dataset[step]
        assert batch["inputs"].shape == (4, 10) and batch["inputs"].dtype == np.int32
        np.testing.assert_array_equal(batch["inputs"][:, 1:], batch["targets"][:, :-1])
        for row in range(4):
            start = row * row_len + step * 10
            np.testing.assert_array_equal(batch["inputs"][row], tokens[start : start + 10])
            np.testing.assert_array_equal(batch["targets"][row], tokens[start + 1 : start + 11])


def test_train_iterator_resumes_from_its_state_and_wraps_epochs():
    stream = pipeline.ArrayStream(np.arange(300) % 256)
    dataset = data.train_dataset(stream, batch_size=2, segment_len=10)  # 14 steps an epoch
    iterator = iter(dataset.to_iter_dataset())
    for _ in range(20):
        next(iterator)
    state = iterator.get_state()
    expected = [next(iterator)["inputs"] for _ in range(3)]
    resumed = iter(dataset.to_iter_dataset())
    resumed.set_state(state)
    for want in expected:
        np.testing.assert_array_equal(next(resumed)["inputs"], want)
    np.testing.assert_array_equal(dataset[14]["inputs"], dataset[0]["inputs"])


def test_each_process_reads_only_its_rows():
    stream = pipeline.ArrayStream(np.arange(2000) % 256)
    whole = data.train_dataset(stream, batch_size=8, segment_len=16)[3]["inputs"]
    parts = [
        data.train_dataset(stream, batch_size=8, segment_len=16, process_index=p, process_count=4)[
            3
        ]
        for p in range(4)
    ]
    np.testing.assert_array_equal(np.concatenate([p["inputs"] for p in parts]), whole)


@pytest.mark.parametrize(
    ("length", "batch", "segment", "max_tokens"),
    [
        (1000, 4, 16, None),
        (1001, 3, 7, None),
        (57, 16, 8, None),
        (1000, 5, 32, 333),
        (2, 4, 4, None),
    ],
)
@pytest.mark.parametrize("whole_segments", [False, True])
def test_eval_scores_every_token_exactly_once(length, batch, segment, max_tokens, whole_segments):
    tokens = np.random.default_rng(length).integers(0, 256, length)
    stream = pipeline.ArrayStream(tokens)
    batches = list(
        data.eval_batches(stream, batch, segment, max_tokens, whole_segments=whole_segments)
    )
    count = (length - 1) if max_tokens is None else max_tokens
    rows = batches[0]["inputs"].shape[0]
    scored = [[] for _ in range(rows)]
    for b in batches:
        assert b["inputs"].shape == (rows, segment)
        for r in range(rows):
            mask = b["weights"][r] > 0
            scored[r].extend(b["targets"][r][mask].tolist())
            # each scored target is the token after its input
            np.testing.assert_array_equal(b["inputs"][r][mask][1:], b["targets"][r][mask][:-1])
    flat = [t for row in scored for t in row]
    assert sum(float(b["weights"].sum()) for b in batches) == count
    np.testing.assert_array_equal(flat, tokens[1 : count + 1])


@pytest.mark.parametrize(("length", "batch", "segment"), [(1000, 4, 16), (1001, 3, 7), (90, 8, 5)])
def test_eval_rows_of_whole_segments_start_every_segment_at_a_multiple_of_its_length(
    length, batch, segment
):
    stream = pipeline.ArrayStream(np.arange(length))  # each token its own position
    batches = list(data.eval_batches(stream, batch, segment, whole_segments=True))
    starts = [b["inputs"][r, 0] for b in batches for r in range(len(b["inputs"]))
              if b["weights"][r, 0] > 0]  # fmt: skip
    assert sorted(starts) == list(range(0, length - 1, segment))  # every segment on the grid
    plain = list(data.eval_batches(stream, batch, segment))  # rows of ceil(N / B): off the grid
    assert any(b["inputs"][r, 0] % segment for b in plain for r in range(len(b["inputs"])))


@pytest.mark.parametrize(
    ("length", "batch", "window", "stride", "max_tokens"),
    [(1000, 4, 64, 16, None), (1001, 3, 50, 7, None), (40, 8, 64, 1, None), (500, 2, 32, 32, 77)],
)
def test_sliding_windows_score_every_token_once_with_full_context(
    length, batch, window, stride, max_tokens
):
    tokens = np.random.default_rng(length).integers(0, 256, length)
    batches = list(
        data.sliding_batches(pipeline.ArrayStream(tokens), batch, window, stride, max_tokens)
    )
    count = (length - 1) if max_tokens is None else max_tokens
    scored = []  # (target index, context length) in order
    for k, b in enumerate(batches):
        assert b["inputs"].shape == (batch, window)
        for r in range(batch):
            start = (k * batch + r) * stride
            for c in np.flatnonzero(b["weights"][r]):
                assert b["inputs"][r][c] == tokens[start + c]
                assert b["targets"][r][c] == tokens[start + c + 1]
                scored.append((start + c, c + 1))
    assert [i for i, _ in scored] == list(range(count))
    # past the first window, every target sees at least window - stride + 1 tokens
    assert all(context >= min(i + 1, window - stride + 1) for i, context in scored)


def test_sliding_window_over_everything_equals_one_long_segment():
    from flax import nnx

    from relpos_jax import TransformerLM
    from relpos_jax.evaluate import evaluate, evaluate_sliding

    stream = pipeline.ArrayStream(np.random.default_rng(0).integers(0, 256, 300))
    model = TransformerLM(
        dict(position="alibi", n_layers=1, d_model=16, n_heads=2, d_ff=32, mem_len=0),
        rngs=nnx.Rngs(0),
    )
    whole = evaluate(model, stream, batch_size=1, segment_len=299, mem_len=0)
    for stride in (5, 299):
        sliding = evaluate_sliding(model, stream, batch_size=4, window=299, stride=stride)
        assert sliding["tokens"] == 299
        np.testing.assert_allclose(sliding["loss"], whole["loss"], rtol=1e-6)
    with pytest.raises(data.DataError, match="stride=0 is invalid"):
        next(data.sliding_batches(stream, 1, 8, 0))


@pytest.mark.parametrize(
    ("call", "names"),
    [
        (lambda d: data.open_split("wikitext9", "train", data_dir=d), "data.name='wikitext9'"),
        (lambda d: data.open_split("text", "train", data_dir=d), "data.path=None"),
        (
            lambda d: data.open_split("text", "train", path="/no/such/file", data_dir=d),
            "data.path='/no/such/file'",
        ),
        (lambda d: data.open_split("enwik8", "train", data_dir=d), "mattmahoney.net"),
        (lambda d: data.open_split("pystdlib", "dev", data_dir=d), "split='dev'"),
    ],
)
def test_bad_datasets_get_one_line(tmp_path, call, names):
    with pytest.raises(data.DataError) as error:
        call(str(tmp_path))
    assert names in str(error.value) and "\n" not in str(error.value)


def test_empty_folder_and_too_small_corpus(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(data.DataError, match="holds no files"):
        data.open_split("text", "train", path=str(tmp_path / "empty"), data_dir=str(tmp_path / "d"))
    small = tmp_path / "small.txt"
    small.write_bytes(b"x" * 100)
    stream = data.open_split("text", "train", path=str(small), data_dir=str(tmp_path / "d"))
    with pytest.raises(
        data.DataError, match=r"data.batch_size=16 is invalid for a split of 90 tokens"
    ):
        data.train_dataset(stream, 16, 128)


def test_builder_identity_changes_with_the_file(tmp_path):
    path = tmp_path / "t.txt"
    path.write_bytes(b"a" * 1000)
    first = builders.config_name("text", str(path))
    path.write_bytes(b"b" * 2000)
    assert builders.config_name("text", str(path)) != first


def test_tfds_text_dataset_through_the_same_pipeline(tmp_path):
    import tensorflow_datasets as tfds

    with tfds.testing.mock_data(num_examples=3, policy=tfds.testing.MockPolicy.USE_CODE):
        stream = data.open_split("tfds:tiny_shakespeare", "valid", data_dir=str(tmp_path))
        assert len(stream) > 10
        batch = data.train_dataset(stream, 2, 4)[0]
        assert batch["inputs"].shape == (2, 4)


def test_concurrent_runs_build_a_corpus_once(text_corpus, tmp_path):
    """Two processes (a sweep's runs) opening one unbuilt corpus: both read it, neither fails on the
    other's half-built files."""
    import subprocess
    import sys

    root, payload = text_corpus
    read = (  # each build takes a second, so that the two overlap
        "import time; from relpos_jax import data; from relpos_jax.data import builders; "
        "split = builders.ByteCorpus._split_generators; "
        "builders.ByteCorpus._split_generators = lambda *a: (time.sleep(1), split(*a))[1]; "
        f"s = data.open_split('text', 'train', path={str(root)!r}, data_dir={str(tmp_path)!r}); "
        "print(len(s))"
    )
    runs = [
        subprocess.Popen(
            [sys.executable, "-c", read], stdout=subprocess.PIPE, stderr=subprocess.PIPE
        )
        for _ in range(2)
    ]
    outputs = [run.communicate(timeout=120) for run in runs]
    for run, (_, err) in zip(runs, outputs, strict=True):
        assert run.returncode == 0, err.decode()[-2000:]
    logs = [out.decode() for out, _ in outputs]
    lengths = {int(log.split()[-1]) for log in logs}
    assert len(lengths) == 1 and 0 < lengths.pop() < len(payload)
    assert sum(log.count("building dataset") for log in logs) == 1


def test_buckets_get_no_lock_file_and_keep_their_scheme():
    assert builders.lock_path("gs://bucket/tfds", "text_1") is None
    assert str(builders.lock_path("/data/tfds", "text_1")) == "/data/tfds/text_1.lock"


def test_another_pythons_pystdlib_is_read_where_that_python_prepared_it(tmp_path, monkeypatch):
    files = corpora.pystdlib_files()[:40]  # a small pystdlib, built in seconds
    monkeypatch.setattr(corpora, "pystdlib_files", lambda: files)
    here = corpora.running_python()
    built = data.open_split("pystdlib", "train", data_dir=str(tmp_path), partition="hash")
    assert builders.config_name("pystdlib", None, partition="hash", python=here) == (
        builders.config_name("pystdlib", None, partition="hash")
    )  # data.python set to this Python's: the same corpus
    monkeypatch.setattr(corpora, "running_python", lambda: "3.99")  # now on another Python
    read = data.open_split(
        "pystdlib", "train", data_dir=str(tmp_path), partition="hash", python=here
    )
    assert len(read) == len(built) > 0
    np.testing.assert_array_equal(read.read(0, len(read)), built.read(0, len(built)))
    with pytest.raises(data.DataError) as error:  # a version nobody prepared there
        data.open_split("pystdlib", "train", data_dir=str(tmp_path), python="3.12")
    message = str(error.value)
    assert message.startswith("data.python='3.12' is invalid here; pystdlib_py312_dedup is not")
    assert "this is Python 3.99" in message and "\n" not in message
