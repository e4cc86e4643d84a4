"""Data: corpora -> tfds array_record builders -> token streams -> grain batches.

``open_data(config.data, split)`` is the one entry point the training and evaluation code use.
"""

from __future__ import annotations

from relpos_jax.data import tokenizer, words
from relpos_jax.data.builders import CHUNK, WordCorpus, build
from relpos_jax.data.corpora import SPLITS, DataError
from relpos_jax.data.pipeline import (
    ArrayStream,
    TokenStream,
    eval_batches,
    sliding_batches,
    train_dataset,
)
from relpos_jax.data.words import Vocabulary


def open_split(
    name: str,
    split: str,
    *,
    path: str | None = None,
    data_dir: str | None = None,
    tokens: str | None = None,
    vocab: str | None = None,
    partition: str = "dedup",
    python: str | None = None,
) -> TokenStream:
    """The token stream of ``split`` (train / valid / test) of corpus ``name``: bytes, word ids
    (``tokens="words"``, the default for WikiText) or enwik8's / text8's official symbols
    (``tokens="symbols"``), the latter two with the stream's ``vocabulary``; ``partition``: how
    pystdlib's files are divided into the splits; ``python``: whose standard library (None: this
    Python's)."""
    if split not in SPLITS:
        raise DataError(f"split={split!r} is invalid; use one of {SPLITS}")
    builder = build(
        name, path, data_dir, tokens=tokens, vocab=vocab, partition=partition, python=python
    )
    source = builder.as_data_source(split)
    if isinstance(builder, WordCorpus):
        return TokenStream(source, CHUNK, "ids", Vocabulary(builder.info.metadata["vocab"]))
    return TokenStream(source, CHUNK)


def open_data(data_config, split: str) -> TokenStream:
    """``open_split`` of ``split`` of the corpus a config's ``data`` section names."""
    d = data_config
    return open_split(
        d.name, split, path=d.path, data_dir=d.dir, tokens=d.tokens, vocab=d.vocab,
        partition=d.partition, python=d.python,
    )  # fmt: skip


def check_vocab_size(stream: TokenStream, vocab_size: int) -> None:
    """A word-level corpus needs ``model.vocab_size`` to be its vocabulary's size (one line)."""
    if stream.vocabulary is not None and len(stream.vocabulary) != vocab_size:
        raise DataError(
            f"model.vocab_size={vocab_size} is invalid; the corpus has {len(stream.vocabulary):,} "
            f"words, set --config.model.vocab_size={len(stream.vocabulary)}"
        )


__all__ = [
    "ArrayStream",
    "DataError",
    "TokenStream",
    "Vocabulary",
    "check_vocab_size",
    "eval_batches",
    "open_data",
    "open_split",
    "sliding_batches",
    "tokenizer",
    "train_dataset",
    "words",
]
