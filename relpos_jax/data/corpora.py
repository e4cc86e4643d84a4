"""Where the bytes come from: one function per corpus, each giving train / valid / test byte streams.

* ``pystdlib`` — the embedded default: the running Python's standard-library sources (tests
  excluded), split by file. Real, structured text with long-range dependencies, on every machine, no
  download. The Python version is part of its name: ``data.python`` names another version's
  (``"3.11"``), read from ``data.dir`` where it was built by that Python (the same corpus on a
  machine with another Python: copy its folder there). ``data.partition`` says how its files are
  divided: ``dedup`` (the default, ``partition.py``: near-duplicate files all in train, valid and
  test of equal zlib difficulty, test at least 64 windows of 32,768 bytes) or ``hash`` (about
  90/5/5 by a stable hash of the relative path, the partition of results recorded before
  ``dedup``).
* ``text`` — a file or a folder of ``.txt``-like files (``data.path``), split 90/5/5 by position.
* ``enwik8`` / ``text8`` — the standard 90M/5M/5M split of the file (or its ``.zip``).
* ``wikitext103`` / ``wikitext2`` — the user's downloaded folder or ``.zip`` with
  ``wiki.{train,valid,test}.tokens`` (or ``{train,valid,test}.txt``, the official code's names);
  word-level (``words.py``) unless ``data.tokens=bytes``.
* ``tfds:<name>`` — any TFDS text dataset (read by ``builders.py`` directly).
"""

from __future__ import annotations

import functools
import hashlib
import pathlib
import re
import sys
import sysconfig
import zipfile
from collections.abc import Iterator

from relpos_jax.data import partition

SPLITS = ("train", "valid", "test")
PARTITIONS = ("dedup", "hash")  # how pystdlib's files are divided (the module docstring)
STANDARD_SPLIT = {"enwik8": 90_000_000, "text8": 90_000_000}  # train bytes; valid and test 5M each
WIKITEXT = ("wikitext103", "wikitext2")
DOWNLOADS = {
    "enwik8": "http://mattmahoney.net/dc/enwik8.zip",
    "text8": "http://mattmahoney.net/dc/text8.zip",
    "wikitext103": "https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-103-v1.zip",
    "wikitext2": "https://s3.amazonaws.com/research.metamind.io/wikitext/wikitext-2-v1.zip",
}
NAMES = ("pystdlib", "text", *STANDARD_SPLIT, *WIKITEXT)
SYMBOL_CORPORA = ("enwik8", "text8")  # data.tokens=symbols: the official code's numbering


class DataError(ValueError):
    """A dataset that cannot be used; the message is one line naming the field and the fix."""


def check_source(name: str, tokens: str | None) -> None:
    """A one-line DataError for a corpus name no reader knows, or ``data.tokens`` that cannot read
    it (the config's check and ``builders.build``'s, one rule)."""
    if not (name in NAMES or name.startswith(("tfds:", "probe:"))):
        raise DataError(
            f"data.name={name!r} is invalid; use one of {', '.join(NAMES)}, tfds:<name> or "
            "probe:<kind>:<distance>"
        )
    if tokens not in (None, "bytes", "words", "symbols"):
        raise DataError(
            f"data.tokens={tokens!r} is invalid; use bytes, words or symbols (None: the corpus's own)"
        )
    if tokens == "symbols" and name not in SYMBOL_CORPORA:
        raise DataError(
            f"data.tokens='symbols' is invalid for {name}; the official numbering is enwik8's and "
            "text8's, use bytes or words"
        )
    if tokens == "words" and name.startswith("probe:"):
        raise DataError(
            f"data.tokens='words' is invalid for {name}; probe corpora are byte-level, leave it unset"
        )


def running_python() -> str:
    """This interpreter's version, ``"3.11"``: whose standard library pystdlib reads."""
    return f"{sys.version_info.major}.{sys.version_info.minor}"


def check_python(python: str | None) -> None:
    """A one-line DataError for a ``data.python`` that is not a version such as ``"3.11"``."""
    if python is not None and not re.fullmatch(r"3\.[0-9]+", str(python)):
        raise DataError(
            f"data.python={python!r} is invalid; use a Python version such as '3.11' (pystdlib of "
            "that Python, prepared in data.dir), or leave it unset for this Python's"
        )


def stdlib_python(name: str, python: str | None) -> str | None:
    """The Python whose standard library corpus ``name`` is, ``data.python`` resolved (unset: this
    one); None where ``name`` is not pystdlib."""
    return (python or running_python()) if name == "pystdlib" else None


def pystdlib_name(python: str | None = None) -> str:
    """``pystdlib_py311``: the corpus of Python ``python``'s standard library (None: this one's)."""
    return f"pystdlib_py{(python or running_python()).replace('.', '')}"


def _is_test_path(parts: tuple[str, ...]) -> bool:
    return any(p in ("test", "tests", "idle_test") or p.startswith("test_") for p in parts)


def pystdlib_files() -> list[pathlib.Path]:
    """The standard library's ``.py`` files, sorted, without tests and installed packages."""
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    files = []
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root).parts
        if "site-packages" in parts or "dist-packages" in parts or _is_test_path(parts):
            continue
        files.append(path)
    return files


def _split_of(name: str) -> str:
    bucket = int(hashlib.sha256(name.encode()).hexdigest(), 16) % 100
    return "train" if bucket < 90 else "valid" if bucket < 95 else "test"


@functools.cache
def _deduplicated_splits() -> dict[str, str]:
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    texts = {path.relative_to(root).as_posix(): path.read_bytes() for path in pystdlib_files()}
    return partition.assign(texts)


def split_of(relative: str, partition_name: str = "dedup") -> str:
    """The split of a standard-library file (its path relative to the library) in a partition."""
    if partition_name == "hash":
        return _split_of(relative)
    return _deduplicated_splits()[relative]


def pystdlib_split(split: str, partition_name: str = "dedup") -> Iterator[bytes]:
    check_partition(partition_name)
    root = pathlib.Path(sysconfig.get_paths()["stdlib"])
    for path in pystdlib_files():
        relative = path.relative_to(root).as_posix()
        if split_of(relative, partition_name) == split:
            yield f"# file: {relative}\n".encode() + path.read_bytes() + b"\n"


def check_partition(name: str) -> None:
    if name not in PARTITIONS:
        raise DataError(f"data.partition={name!r} is invalid; use one of {', '.join(PARTITIONS)}")


def _text_files(path: pathlib.Path) -> list[pathlib.Path]:
    if path.is_file():
        return [path]
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
        if files:
            return files
        raise DataError(
            f"data.path={str(path)!r} is invalid; the folder holds no files, put text files in it"
        )
    raise DataError(
        f"data.path={str(path)!r} is invalid; no such file or folder, pass a text file or folder"
    )


def _read(path: pathlib.Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as error:
        raise DataError(
            f"data.path={str(path)!r} is invalid; cannot read it ({error.strerror}), fix its permissions"
        ) from error


def text_split(path: str | None, split: str) -> Iterator[bytes]:
    if not path:
        raise DataError(
            "data.path=None is invalid; data.name=text needs --config.data.path=FILE_OR_FOLDER"
        )
    data = b"".join(_read(f) for f in _text_files(pathlib.Path(path).expanduser()))
    n = len(data)
    bounds = {
        "train": (0, int(n * 0.9)),
        "valid": (int(n * 0.9), int(n * 0.95)),
        "test": (int(n * 0.95), n),
    }
    start, stop = bounds[split]
    yield data[start:stop]


def standard_split(name: str, path: str | None, split: str) -> Iterator[bytes]:
    """enwik8 / text8: the first 90M bytes train, then 5M valid, 5M test (Transformer-XL's prep)."""
    if not path or not pathlib.Path(path).expanduser().exists():
        raise DataError(
            f"data.path={path!r} is invalid; {name} is not bundled: download {DOWNLOADS[name]} and pass "
            f"--config.data.path=/path/to/{name}.zip (or the unzipped file)"
        )
    file = pathlib.Path(path).expanduser()
    if zipfile.is_zipfile(file):
        with zipfile.ZipFile(file) as archive:
            data = archive.read(archive.namelist()[0])
    else:
        data = _read(file)
    train = STANDARD_SPLIT[name]
    if len(data) < train + 2:
        raise DataError(
            f"data.path={str(file)!r} is invalid; {len(data):,} bytes is not {name} "
            f"(expected about {train + 10_000_000:,}); download {DOWNLOADS[name]}"
        )
    valid_end = train + (len(data) - train) // 2
    bounds = {"train": (0, train), "valid": (train, valid_end), "test": (valid_end, len(data))}
    start, stop = bounds[split]
    yield data[start:stop]


def _wikitext_names(split: str) -> tuple[str, str]:
    return f"wiki.{split}.tokens", f"{split}.txt"


def wikitext_split(name: str, path: str | None, split: str) -> Iterator[bytes]:
    """The split's file of a WikiText folder or zip (any folder depth inside the zip)."""
    fix = f"download {DOWNLOADS[name]} and pass --config.data.path=/path/to/it (the zip or folder)"
    if not path or not pathlib.Path(path).expanduser().exists():
        raise DataError(f"data.path={path!r} is invalid; {name} is not bundled: {fix}")
    root, wanted = pathlib.Path(path).expanduser(), _wikitext_names(split)
    if zipfile.is_zipfile(root):
        with zipfile.ZipFile(root) as archive:
            members = [m for m in archive.namelist() if m.rsplit("/", 1)[-1] in wanted]
            if members:
                yield archive.read(sorted(members, key=len)[0])
                return
    elif root.is_dir():
        for file_name in wanted:
            found = sorted(root.rglob(file_name), key=lambda p: len(p.parts))
            if found:
                yield _read(found[0])
                return
    raise DataError(
        f"data.path={str(root)!r} is invalid; it holds no {' or '.join(wanted)} for {name}: {fix}"
    )


def split_stream(
    name: str, path: str | None, split: str, partition_name: str = "dedup"
) -> Iterator[bytes]:
    """Byte pieces whose concatenation is ``split`` of corpus ``name`` (not ``tfds:``); pystdlib's
    files divided as ``partition_name`` says."""
    if name == "pystdlib":
        return pystdlib_split(split, partition_name)
    if name == "text":
        return text_split(path, split)
    if name in STANDARD_SPLIT:
        return standard_split(name, path, split)
    if name in WIKITEXT:
        return wikitext_split(name, path, split)
    raise DataError(f"data.name={name!r} is invalid; use {', '.join(NAMES)} or tfds:<name>")
