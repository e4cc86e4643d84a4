"""Where numbers go: ``metrics.jsonl`` (one JSON object per logged step) and TensorBoard events.

Only process 0 writes; other processes get a writer that does nothing. A resumed run appends to the
same file; a record cut short by a kill is dropped first, so every line stays one JSON object.
"""

from __future__ import annotations

import json
import math
import pathlib
from typing import Any

BITS_PER_NAT = 1.0 / math.log(2.0)


class MetricsWriter:
    def __init__(self, workdir: str | pathlib.Path, *, enabled: bool = True):
        self.enabled = enabled
        self.path = pathlib.Path(workdir) / "metrics.jsonl"
        self._board = None
        if enabled:
            from tensorboardX import SummaryWriter

            self.path.parent.mkdir(parents=True, exist_ok=True)
            _drop_partial_line(self.path)
            self._board = SummaryWriter(str(self.path.parent / "tensorboard"))

    def write(self, step: int, values: dict[str, Any]) -> None:
        if not self.enabled:
            return
        record = {"step": int(step), **{k: _plain(v) for k, v in values.items()}}
        with self.path.open("a") as file:
            file.write(json.dumps(record) + "\n")
        for key, value in record.items():
            if key != "step" and isinstance(value, int | float):
                self._board.add_scalar(key, value, step)
        self._board.flush()

    def close(self) -> None:
        if self._board is not None:
            self._board.close()


def _plain(value: Any) -> Any:
    try:
        return float(value)
    except (TypeError, ValueError):
        return value


def _drop_partial_line(path: pathlib.Path) -> None:
    """A run killed mid-write leaves half a record at the end: cut it, keep every whole line."""
    if not path.exists():
        return
    data = path.read_bytes()
    if data and not data.endswith(b"\n"):
        with path.open("r+b") as file:
            file.truncate(data.rfind(b"\n") + 1)


def read_metrics(workdir: str | pathlib.Path) -> list[dict[str, Any]]:
    path = pathlib.Path(workdir) / "metrics.jsonl"
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
