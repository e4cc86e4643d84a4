"""Data: corpora -> tfds array_record builders -> token streams -> grain batches.

``open_split(data_config, split)`` is the one entry point the training and evaluation code use.
"""

from __future__ import annotations

from relpos_jax.data import tokenizer
from relpos_jax.data.builders import CHUNK, build
from relpos_jax.data.corpora import SPLITS, DataError
from relpos_jax.data.pipeline import (
    ArrayStream,
    TokenStream,
    eval_batches,
    sliding_batches,
    train_dataset,
)


def open_split(
    name: str, split: str, *, path: str | None = None, data_dir: str | None = None
) -> TokenStream:
    """The token stream of ``split`` (train / valid / test) of corpus ``name``."""
    if split not in SPLITS:
        raise DataError(f"split={split!r} is invalid; use one of {SPLITS}")
    builder = build(name, path, data_dir)
    return TokenStream(builder.as_data_source(split), CHUNK)


__all__ = [
    "ArrayStream",
    "DataError",
    "TokenStream",
    "eval_batches",
    "open_split",
    "sliding_batches",
    "tokenizer",
    "train_dataset",
]
