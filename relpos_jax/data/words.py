"""Word-level tokens, the way Transformer-XL's word-level corpora (WikiText-103) are read.

A split's text is read line by line (Python's universal newlines, as ``open(path, "r")`` reads
it), each line split on whitespace and closed by ``<eos>`` — an empty line is one ``<eos>``. The
vocabulary comes from the train split: ``<eos>`` first, then every word of train by descending
count, ties in order of first appearance (``Counter.most_common``), so that ids follow frequency
and the adaptive softmax's clusters (``model.cutoffs``) cut it by frequency. ``<unk>`` is where
train has it (WikiText marks rare words with it) or last: a word of valid or test that train never
saw reads as ``<unk>``. A vocabulary file (``data.vocab``: one word per line, the line number its id,
such as a released model's) replaces the train-built one.

The official code's symbols of enwik8 and text8 (``data.tokens=symbols``, what its released
character-level models were trained on) are bytes numbered its way: line breaks dropped, the
vocabulary counted over all three splits (``official_symbols``, ``symbol_order``).
"""

from __future__ import annotations

import collections
import io
import pathlib
from collections.abc import Iterable, Iterator, Sequence

import numpy as np

from relpos_jax.data.corpora import DataError

EOS = "<eos>"
UNK = "<unk>"


def lines(pieces: Iterable[bytes]) -> Iterator[str]:
    """The lines of a split's UTF-8 byte pieces, ``\\r\\n`` and ``\\r`` ending lines as ``\\n`` does
    (``str.splitlines`` would also cut at form feeds and U+2028, which ``open`` does not)."""
    text = b"".join(pieces).decode("utf-8", errors="replace")
    yield from io.StringIO(text, newline=None)


def tokenize(line: str) -> list[str]:
    return [*line.split(), EOS]


def build_vocabulary(train_lines: Iterable[str]) -> list[str]:
    """``<eos>``, then train's words by descending count (ties: first seen first), ``<unk>`` last
    if train lacks it."""
    counts = collections.Counter()
    for line in train_lines:
        counts.update(line.split())
    words = [EOS, *(w for w, _ in counts.most_common() if w != EOS)]
    return words if UNK in counts else [*words, UNK]


def read_vocabulary(path: str) -> list[str]:
    """A vocabulary file: one word per line (its first whitespace-separated field), id = line."""
    file = pathlib.Path(path).expanduser()
    if not file.is_file():
        raise DataError(
            f"data.vocab={path!r} is invalid; no such file, pass a file of one word per line"
        )
    words = [line.split()[0] for line in file.read_text("utf-8").splitlines() if line.strip()]
    missing = [w for w in (EOS, UNK) if w not in words]
    if missing:
        raise DataError(
            f"data.vocab={path!r} is invalid; it lacks {' and '.join(missing)}, which word-level "
            "text needs (line ends, unknown words)"
        )
    if len(set(words)) != len(words):
        raise DataError(f"data.vocab={path!r} is invalid; a word appears twice, keep one of each")
    return words


def official_symbols(name: str, data: bytes) -> np.ndarray:
    """An enwik8 / text8 split as the official code reads it, each symbol as its byte value: its
    prep scripts write enwik8's bytes as numbers, its line breaks as line ends (read without
    ``<eos>``: they are not symbols), and text8's characters, the split stripped of spaces at its
    ends, spaces written ``_``."""
    if name == "text8":
        return np.frombuffer(data.strip(b" "), np.uint8)
    array = np.frombuffer(data, np.uint8)
    return array[array != ord("\n")]


def symbol_name(name: str, byte: int) -> str:
    """What the official prep writes for a byte: enwik8 its number, text8 the character."""
    if name == "text8":
        return "_" if byte == ord(" ") else chr(byte)
    return str(byte)


def symbol_order(splits: Sequence[np.ndarray]) -> np.ndarray:
    """The bytes of the official vocabulary, counted over train, valid and test together: by
    descending count, ties by first appearance (``Counter.most_common`` of Python 3)."""
    stream = np.concatenate(splits)
    counts = np.bincount(stream, minlength=256)
    present, first = np.unique(stream, return_index=True)
    return present[np.lexsort((first, -counts[present]))]


class Vocabulary:
    """Words <-> ids for word-level corpora (``tokenizer`` is the byte-level counterpart)."""

    def __init__(self, words: Sequence[str]):
        self.words = list(words)
        self.ids = {w: i for i, w in enumerate(self.words)}
        self.unk = self.ids.get(UNK)  # None: every symbol is known (enwik8's, text8's)

    def __len__(self) -> int:
        return len(self.words)

    def encode_lines(self, text_lines: Iterable[str]) -> Iterator[np.ndarray]:
        """Each line's ids (its words, then ``<eos>``) as an ``int32`` array."""
        get, unk = self.ids.get, self.unk
        for line in text_lines:
            yield np.fromiter((get(w, unk) for w in tokenize(line)), np.int32)

    def encode(self, text: str) -> np.ndarray:
        """Text as ids, without a final ``<eos>`` unless the text ends with a line break."""
        parts = text.split("\n")
        words = [w for part in parts[:-1] for w in tokenize(part)] + parts[-1].split()
        unknown = [w for w in words if w not in self.ids]
        if unknown and self.unk is None:
            raise DataError(f"encode: {unknown[0]!r} is not in the vocabulary, which has no <unk>")
        return np.fromiter((self.ids.get(w, self.unk) for w in words), np.int32)

    def decode(self, ids) -> str:
        """Ids back to text: words joined by spaces, ``<eos>`` as a line break."""
        text, line = [], []
        for i in np.asarray(ids).reshape(-1):
            word = self.words[int(i)]
            if word == EOS:
                text.append(" ".join(line) + "\n")
                line = []
            else:
                line.append(word)
        return "".join(text) + " ".join(line)
