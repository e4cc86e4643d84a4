"""A long evaluation pass kept as it goes, so that a stopped pass goes on where it stopped.

``relpos_jax.evaluate`` scores a split block by block (one compiled call each) and sums the
blocks' losses on the host. Given a ``PassProgress``, it also writes what it has summed so far,
the number of blocks done and the memory after them, to one file (written whole, then renamed
into place) at most every ``every_s`` seconds, and once more at its end; a pass started again with
the same file and ``key`` skips the blocks kept there and goes on from their sums and memory: the
same result, bit for bit, as one pass (the sums are kept in float64 and added in the same order).
``key`` names the pass (model, data and settings: the caller's to say), ``calls`` how ``evaluate``
cut it into calls (segments a call and their shape: its own to say); a file with another key or
other calls, or one that cannot be read, is ignored. The caller removes the file (``done``) once it has stored the
result, so that a stop in between loses nothing. One process: a pass whose rows are split over
processes keeps nothing.

On a CPU a pass at 32,768 tokens over a whole test split takes an hour; on an accelerator,
seconds, and it is kept once, at its end.
"""

from __future__ import annotations

import dataclasses
import pathlib
import time
import zipfile
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from relpos_jax.files import replace_whole

EVERY_S = 60.0
"""Seconds between two writes of a pass's progress (a stop loses at most this much scoring)."""


@dataclasses.dataclass
class PassProgress:
    """Where one evaluation pass keeps its progress (``path``) and what names the pass (``key``)."""

    path: pathlib.Path
    key: str
    every_s: float = EVERY_S
    _last: float = dataclasses.field(default_factory=time.monotonic, init=False)

    def resumed(self, calls: str | None = None) -> tuple[int, list[dict], list[np.ndarray] | None]:
        """What the file keeps for this pass: (blocks done, their sums as one block in a list, the
        memory's leaves after them); ``(0, [], None)`` where there is none for this ``key`` and,
        unless None, these ``calls``."""
        try:
            with np.load(self.path) as kept:
                if str(kept["key"]) != self.key or calls not in (None, str(kept["calls"])):
                    return 0, [], None
                sums = {k.removeprefix("sums."): kept[k] for k in kept.files if k[:5] == "sums."}
                leaves = sorted((k for k in kept.files if k[:5] == "mems."), key=_leaf_index)
                return int(kept["blocks"]), [sums], [kept[k] for k in leaves]
        except (OSError, KeyError, ValueError, zipfile.BadZipFile):
            return 0, [], None

    def due(self) -> bool:
        """Whether ``every_s`` seconds have passed since the pass began or was last kept."""
        return time.monotonic() - self._last >= self.every_s

    def keep(self, blocks: int, sums: list[dict], mems: Any, calls: str) -> list[dict]:
        """Writes the sums of the first ``blocks`` calls (``sums``: one dict a call, or merged) of
        these ``calls`` and the memory after them; -> the sums merged as one, to go on adding to."""
        merged = merge(sums)
        arrays = {"key": np.array(self.key), "calls": np.array(calls), "blocks": np.array(blocks)}
        arrays |= {f"sums.{k}": v for k, v in merged.items()}
        arrays |= {f"mems.{i}": _host(leaf) for i, leaf in enumerate(jax.tree.leaves(mems))}
        replace_whole(self.path, lambda f: np.savez(f, **arrays))
        self._last = time.monotonic()
        return [merged]

    def done(self) -> None:
        """The pass's result is stored: its progress is no longer needed."""
        self.path.unlink(missing_ok=True)


def merge(sums: list[dict]) -> dict[str, np.ndarray]:
    """Blocks' sums as one block, in float64: each segment's row sums one after the other
    (``row_*``, ``[S, B]``), the sums over the segments added in order (``position_*``), as
    ``evaluate`` adds them at the end."""
    return {
        k: np.concatenate([np.asarray(s[k], np.float64) for s in sums])
        if k.startswith("row_")
        else sum(np.asarray(s[k], np.float64) for s in sums)
        for k in sums[0]
    }


def restored(template: Any, leaves: list[np.ndarray]) -> Any:
    """A memory shaped as ``template`` (a fresh ``init_mems``) holding the kept ``leaves``."""
    target = jax.tree.leaves(template)
    if [np.shape(x) for x in leaves] != [np.shape(x) for x in target]:
        raise ValueError("eval_progress: the kept memory does not match this pass's")
    dtypes = [t.dtype if hasattr(t, "dtype") else type(t) for t in target]
    values = [jnp.asarray(x, dtype=d) for x, d in zip(leaves, dtypes, strict=True)]  # on device
    return jax.tree.unflatten(jax.tree.structure(template), values)


def _host(leaf) -> np.ndarray:
    """A memory leaf on the host; floats as float32 (exact for bfloat16, which npz cannot hold)."""
    array = np.asarray(leaf)
    return array.astype(np.float32) if jnp.issubdtype(array.dtype, jnp.floating) else array


def _leaf_index(name: str) -> int:
    return int(name.split(".")[1])
