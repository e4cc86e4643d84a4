"""Every corpus as a tensorflow-datasets builder in the array_record format (no TensorFlow needed).

Each split is stored as its byte stream cut into fixed-size records (``CHUNK`` bytes, the last one
shorter), in order, so that any span of the stream is one or two random-access reads. A corpus is
built once into ``data.dir`` (default ``~/.cache/relpos_jax/tfds``) and reused; its config name
identifies the content (the Python version for pystdlib, path/size/mtime for user files).
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import pathlib

import numpy as np
import tensorflow_datasets as tfds

from relpos_jax.data import corpora, probes

CHUNK = 1 << 16
DEFAULT_DIR = pathlib.Path(
    os.environ.get("RELPOS_DATA_DIR", "~/.cache/relpos_jax/tfds")
).expanduser()
TFDS_SPLITS = {"train": ("train",), "valid": ("validation", "valid", "dev"), "test": ("test",)}


@dataclasses.dataclass(eq=False)
class CorpusConfig(tfds.core.BuilderConfig):
    corpus: str = "pystdlib"
    path: str | None = None


def _chunks(pieces, size=CHUNK):
    """Records of ``size`` bytes; an empty split is one empty record (tfds needs one), so that an
    empty or tiny corpus reaches the pipeline's one-line "too small" error instead."""
    buffer, written = bytearray(), False
    for piece in pieces:
        buffer += piece
        while len(buffer) >= size:
            yield bytes(buffer[:size])
            written = True
            del buffer[:size]
    if buffer or not written:
        yield bytes(buffer)


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


class ByteCorpus(tfds.core.GeneratorBasedBuilder):
    """A corpus as byte-stream chunks; see the module docstring."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self) -> tfds.core.DatasetInfo:
        return tfds.core.DatasetInfo(
            builder=self,
            description=f"Byte stream of {self.builder_config.corpus} in {CHUNK}-byte records.",
            features=tfds.features.FeaturesDict(
                {"bytes": tfds.features.Tensor(shape=(None,), dtype=np.uint8)}
            ),
            disable_shuffling=True,  # records must stay in stream order
        )

    def _split_generators(self, dl_manager):
        return {split: self._generate_examples(split) for split in corpora.SPLITS}

    def _generate_examples(self, split):
        cfg = self.builder_config
        if cfg.corpus.startswith("tfds:"):
            pieces = _tfds_pieces(cfg.corpus[5:], split, cfg.path)
        elif cfg.corpus.startswith("probe:"):
            pieces = probes.split_stream(cfg.corpus, split)
        else:
            pieces = corpora.split_stream(cfg.corpus, cfg.path, split)
        for index, chunk in enumerate(_chunks(pieces)):
            yield index, {"bytes": np.frombuffer(chunk, np.uint8)}


def config_name(name: str, path: str | None) -> str:
    if name == "pystdlib":
        return corpora.pystdlib_name()
    if name.startswith("probe:"):  # the generator's version: a change rebuilds
        return name.replace(":", "_").replace("-", "to") + f"_v{probes.VERSION}"
    if name.startswith("tfds:"):
        return "tfds_" + name[5:].replace("/", "_").replace(":", "_")
    identity = str(name)
    if path and pathlib.Path(path).expanduser().exists():
        p = pathlib.Path(path).expanduser().resolve()
        stat = p.stat()
        identity += f"|{p}|{stat.st_size}|{stat.st_mtime_ns}"
    return f"{name}_{hashlib.sha1(identity.encode()).hexdigest()[:12]}"


def _quiet() -> None:
    tfds.disable_progress_bar()
    logging.getLogger("absl").setLevel(logging.ERROR)


def build(
    name: str, path: str | None = None, data_dir: str | pathlib.Path | None = None
) -> ByteCorpus:
    """The prepared builder of corpus ``name`` (built on first use)."""
    if name.startswith("probe:"):
        probes.parse(name)  # a one-line error for a malformed probe name
    elif not (
        name in ("pystdlib", "text") or name in corpora.STANDARD_SPLIT or name.startswith("tfds:")
    ):
        raise corpora.DataError(
            f"data.name={name!r} is invalid; use pystdlib, text, enwik8, text8, tfds:<name> or "
            "probe:<kind>:<distance>"
        )
    if name in ("text", *corpora.STANDARD_SPLIT):
        list(corpora.split_stream(name, path, "test"))  # fail early, with the one-line message
    _quiet()
    config = CorpusConfig(name=config_name(name, path), corpus=name, path=path, version="1.0.0")
    builder = ByteCorpus(
        config=config, data_dir=str(data_dir or DEFAULT_DIR), file_format="array_record"
    )
    if not builder.is_prepared():
        print(f"building dataset {name} into {builder.data_dir} (once)", flush=True)
        builder.download_and_prepare()
    return builder
