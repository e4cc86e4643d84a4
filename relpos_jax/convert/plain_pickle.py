"""Reading a pickle as plain data: no code in it ever runs.

``pickle.load`` calls whatever callable a file names (``os.system``, ``pathlib.Path.write_text``,
…), so a downloaded model folder could run anything while it is converted. ``load`` reads with an
unpickler that builds only what pickle builds without a lookup (lists, tuples, dicts, sets, strings,
bytes, numbers, booleans, None) and the few classes the released Transformer-XL vocabularies hold
(``collections.Counter``, ``collections.OrderedDict``); any other name in the file ends the read
with ``RefusedPickle``, before anything it names is called.
"""

from __future__ import annotations

import collections
import io
import pathlib
import pickle
from typing import Any

ALLOWED = {
    ("collections", "Counter"): collections.Counter,
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("builtins", "set"): set,
    ("builtins", "frozenset"): frozenset,
    ("__builtin__", "set"): set,  # protocol 2's name for them (Python 2's module)
    ("__builtin__", "frozenset"): frozenset,
}


class RefusedPickle(pickle.UnpicklingError):
    """The file names a callable outside ``ALLOWED``; the message says which."""


class _PlainData(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        if (module, name) in ALLOWED:
            return ALLOWED[module, name]
        raise RefusedPickle(f"{module}.{name}")


def loads(data: bytes) -> Any:
    """The plain data pickled in ``data``; ``RefusedPickle`` names the first callable it would call."""
    return _PlainData(io.BytesIO(data)).load()


def load(path: str | pathlib.Path) -> Any:
    """``loads`` of the file at ``path``."""
    return loads(pathlib.Path(path).read_bytes())
