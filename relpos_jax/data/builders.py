"""Every corpus as a tensorflow-datasets builder in the array_record format (no TensorFlow needed).

Each split is stored as its token stream cut into fixed-size records (``CHUNK`` tokens, the last one
shorter), in order, so that any span of the stream is one or two random-access reads: bytes
(``ByteCorpus``, feature ``bytes``) or word ids (``WordCorpus``, feature ``ids``, its vocabulary in
the dataset's metadata; ``words.py``). A corpus is built once into ``data.dir`` (default
``~/.cache/relpos_jax/tfds``) and reused; its config name identifies the content (the Python version
for pystdlib, path/size/mtime for user files and a vocabulary file).
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import hashlib
import logging
import os
import pathlib

import numpy as np
import tensorflow_datasets as tfds

from relpos_jax.data import corpora, probes, words

CHUNK = 1 << 16
DEFAULT_DIR = pathlib.Path(
    os.environ.get("RELPOS_DATA_DIR", "~/.cache/relpos_jax/tfds")
).expanduser()
TFDS_SPLITS = {"train": ("train",), "valid": ("validation", "valid", "dev"), "test": ("test",)}


@dataclasses.dataclass(eq=False)
class CorpusConfig(tfds.core.BuilderConfig):
    corpus: str = "pystdlib"
    path: str | None = None
    vocab: str | None = None  # words: a vocabulary file instead of the train-built one
    tokens: str = "bytes"  # bytes | words | symbols (enwik8 / text8 numbered the official way)
    partition: str = "dedup"  # pystdlib: how its files are divided (corpora.PARTITIONS)
    python: str | None = None  # pystdlib: whose standard library (None: this Python's)


def _records(pieces, dtype, size=CHUNK):
    """Records of ``size`` tokens from arrays (or byte strings) of any length; an empty split is one
    empty record (tfds needs one), so that an empty or tiny corpus reaches the pipeline's one-line
    "too small" error instead."""
    parts, count, written = [], 0, False
    for piece in pieces:
        parts.append(np.frombuffer(piece, np.uint8) if isinstance(piece, bytes) else piece)
        count += len(parts[-1])
        if count >= size:
            joined = np.concatenate(parts)
            whole = len(joined) // size * size
            for start in range(0, whole, size):
                yield joined[start : start + size]
            written, parts, count = True, [joined[whole:]], len(joined) - whole
    if count or not written:
        yield np.concatenate(parts).astype(dtype) if parts else np.zeros(0, dtype)


def _tfds_pieces(name: str, split: str, data_dir: str | None):
    builder = tfds.builder(name, data_dir=data_dir)
    available = set(builder.info.splits.keys())
    chosen = next((s for s in TFDS_SPLITS[split] if s in available), None)
    if chosen is None:
        raise corpora.DataError(
            f"data.name='tfds:{name}' is invalid; it has splits {sorted(available)}, "
            f"none of {TFDS_SPLITS[split]} for {split}"
        )
    text_keys = [k for k, f in builder.info.features.items() if isinstance(f, tfds.features.Text)]
    if not text_keys:
        raise corpora.DataError(f"data.name='tfds:{name}' is invalid; it has no text feature")
    source = builder.as_data_source(chosen)
    for index in range(len(source)):
        text = source[index][text_keys[0]]
        yield (text if isinstance(text, bytes) else str(text).encode()) + b"\n"


def _pieces(cfg: CorpusConfig, split: str):
    """The byte pieces of ``split`` of the configured corpus."""
    if cfg.corpus.startswith("tfds:"):
        return _tfds_pieces(cfg.corpus[5:], split, cfg.path)
    if cfg.corpus.startswith("probe:"):
        return probes.split_stream(cfg.corpus, split)
    return corpora.split_stream(cfg.corpus, cfg.path, split, cfg.partition)


def _records_info(builder, what: str, key: str, dtype, metadata=None) -> tfds.core.DatasetInfo:
    """A corpus of ``CHUNK``-token records of feature ``key``, kept in stream order."""
    return tfds.core.DatasetInfo(
        builder=builder,
        description=f"{what} of {builder.builder_config.corpus} in {CHUNK}-token records.",
        features=tfds.features.FeaturesDict(
            {key: tfds.features.Tensor(shape=(None,), dtype=dtype)}
        ),
        metadata=metadata,
        disable_shuffling=True,  # records must stay in stream order
    )


class ByteCorpus(tfds.core.GeneratorBasedBuilder):
    """A corpus as byte-stream chunks; see the module docstring."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self) -> tfds.core.DatasetInfo:
        return _records_info(self, "Byte stream", "bytes", np.uint8)

    def _split_generators(self, dl_manager):
        return {split: self._generate_examples(split) for split in corpora.SPLITS}

    def _generate_examples(self, split):
        for index, record in enumerate(_records(_pieces(self.builder_config, split), np.uint8)):
            yield index, {"bytes": record}


class WordCorpus(tfds.core.GeneratorBasedBuilder):
    """A corpus as word ids, or enwik8's / text8's official symbols (``words.py``), the
    vocabulary in the metadata (``metadata.json``)."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self) -> tfds.core.DatasetInfo:
        return _records_info(self, "Word ids", "ids", np.int32, tfds.core.MetadataDict())

    def _split_generators(self, dl_manager):
        cfg = self.builder_config
        if cfg.tokens == "symbols":
            return self._symbol_splits(cfg)
        if cfg.vocab:
            vocabulary = words.read_vocabulary(cfg.vocab)
        else:
            vocabulary = words.build_vocabulary(words.lines(_pieces(cfg, "train")))
        self.info.metadata["vocab"] = vocabulary
        vocab = words.Vocabulary(vocabulary)
        return {split: self._generate_examples(vocab, split) for split in corpora.SPLITS}

    def _generate_examples(self, vocab: words.Vocabulary, split: str):
        ids = vocab.encode_lines(words.lines(_pieces(self.builder_config, split)))
        for index, record in enumerate(_records(ids, np.int32)):
            yield index, {"ids": record}

    def _symbol_splits(self, cfg: CorpusConfig):
        splits = {
            split: words.official_symbols(cfg.corpus, b"".join(_pieces(cfg, split)))
            for split in corpora.SPLITS
        }
        order = words.symbol_order(list(splits.values()))
        self.info.metadata["vocab"] = [words.symbol_name(cfg.corpus, int(b)) for b in order]
        ids = np.zeros(256, np.int32)
        ids[order] = np.arange(len(order), dtype=np.int32)
        return {split: self._symbol_examples(ids[data]) for split, data in splits.items()}

    def _symbol_examples(self, ids: np.ndarray):
        for index, record in enumerate(_records([ids], np.int32)):
            yield index, {"ids": record}


def config_name(
    name: str,
    path: str | None,
    vocab: str | None = None,
    partition: str = "dedup",
    python: str | None = None,
) -> str:
    if name == "pystdlib":  # "hash" keeps the name it had before partitions had names
        return corpora.pystdlib_name(python) + ("" if partition == "hash" else f"_{partition}")
    if name.startswith("probe:"):  # the generator's version: a change rebuilds
        return name.replace(":", "_").replace("-", "to") + f"_v{probes.VERSION}"
    if name.startswith("tfds:"):
        return "tfds_" + name[5:].replace("/", "_").replace(":", "_")
    identity = str(name) + _file_identity(path) + _file_identity(vocab)
    return f"{name}_{hashlib.sha1(identity.encode()).hexdigest()[:12]}"


def _file_identity(path: str | None) -> str:
    if not path or not pathlib.Path(path).expanduser().exists():
        return ""
    p = pathlib.Path(path).expanduser().resolve()
    stat = p.stat()
    return f"|{p}|{stat.st_size}|{stat.st_mtime_ns}"


def _quiet() -> None:
    tfds.disable_progress_bar()
    logging.getLogger("absl").setLevel(logging.ERROR)


def level(name: str, tokens: str | None) -> str:
    """``data.tokens`` resolved: as given, else words for WikiText and bytes for the rest."""
    return tokens or ("words" if name in corpora.WIKITEXT else "bytes")


def build(
    name: str,
    path: str | None = None,
    data_dir: str | pathlib.Path | None = None,
    *,
    tokens: str | None = None,
    vocab: str | None = None,
    partition: str = "dedup",
    python: str | None = None,
) -> ByteCorpus | WordCorpus:
    """The prepared builder of corpus ``name`` (built on first use), byte- or word-level;
    ``partition``: how pystdlib's files are divided (``corpora.PARTITIONS``); ``python``: whose
    standard library it is (None: this Python's; another one's must be prepared in ``data_dir``)."""
    corpora.check_source(name, tokens)
    corpora.check_partition(partition)
    corpora.check_python(python)
    python = python if name == "pystdlib" else None  # it means nothing for the other corpora
    kind = level(name, tokens)
    if name.startswith("probe:"):
        probes.parse(name)  # a one-line error for a malformed probe name
    if name in ("text", *corpora.STANDARD_SPLIT, *corpora.WIKITEXT):
        for _ in corpora.split_stream(name, path, "test"):  # fail early, in one line
            break
    word_level = kind == "words"
    if word_level and vocab:
        words.read_vocabulary(vocab)  # fail early, in one line
    _quiet()
    config = CorpusConfig(
        name=config_name(name, path, vocab if word_level else None, partition, python)
        + ("_symbols" if kind == "symbols" else ""),
        corpus=name,
        path=path,
        vocab=vocab if word_level else None,
        tokens=kind,
        partition=partition,
        python=python,
        version="1.0.0",
    )
    root = str(data_dir or DEFAULT_DIR)  # a string: pathlib would fold gs:// into gs:/

    def builder():
        cls = ByteCorpus if kind == "bytes" else WordCorpus
        return cls(config=config, data_dir=root, file_format="array_record")

    prepared = builder()
    if prepared.is_prepared():
        return prepared
    if python not in (None, corpora.running_python()):  # this Python cannot build it
        folder = str(prepared.data_dir).rsplit("/", 1)[0]  # the corpus's, above its version's
        raise corpora.DataError(
            f"data.python={python!r} is invalid here; {config.name} is not prepared in {root} and "
            f"this is Python {corpora.running_python()}: copy {folder} from a machine where "
            f"Python {python} built it, or leave data.python unset"
        )
    with _preparing(lock_path(root, config.name)):  # concurrent runs of a sweep build it once
        prepared = builder()  # another process may have built it while this one waited
        if not prepared.is_prepared():
            print(f"building dataset {name} into {prepared.data_dir} (once)", flush=True)
            prepared.download_and_prepare()
    return prepared


def lock_path(data_dir: str, config_name: str) -> pathlib.Path | None:
    """The file whose lock guards building ``config_name`` in ``data_dir``; None for a bucket
    (``gs://…``), which has no file locks."""
    return None if "://" in data_dir else pathlib.Path(data_dir) / f"{config_name}.lock"


@contextlib.contextmanager
def _preparing(path: pathlib.Path | None):
    """Hold an exclusive lock on ``path`` (local or NFS data dirs; None: none) while a corpus is
    built."""
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        yield
