"""The one orbax wrapper: model + optimizer state, segment memory, data iterator and step.

Orbax writes each checkpoint into a temporary folder and renames it when complete, so a run killed
mid-save leaves the previous checkpoint intact; the last ``keep`` are kept.
"""

from __future__ import annotations

import pathlib
from typing import Any

import orbax.checkpoint as ocp


def _storable(mems: Any) -> dict[str, Any]:
    """Memory as a dict; a memory of length 0 (no recurrence) has no states to store."""
    return {"valid": mems.valid} | ({"states": mems.states} if mems.states.size else {})


class Checkpointer:
    def __init__(self, directory: str | pathlib.Path, *, keep: int = 3):
        self.directory = pathlib.Path(directory).resolve()
        options = ocp.CheckpointManagerOptions(max_to_keep=keep, create=True)
        self.manager = ocp.CheckpointManager(self.directory, options=options)

    def latest_step(self) -> int | None:
        return self.manager.latest_step()

    def save(self, step: int, *, state: Any, mems: Any, data: dict, meta: dict) -> None:
        self.manager.save(
            step,
            args=ocp.args.Composite(
                state=ocp.args.StandardSave(state),
                mems=ocp.args.StandardSave(_storable(mems)),
                data=ocp.args.JsonSave(data),
                meta=ocp.args.JsonSave(meta),
            ),
        )

    def restore(self, step: int, *, state: Any, mems: Any) -> dict[str, Any]:
        """Restore into the structure (and shardings) of ``state`` and ``mems``."""
        restored = dict(
            self.manager.restore(
                step,
                args=ocp.args.Composite(
                    state=ocp.args.StandardRestore(state),
                    mems=ocp.args.StandardRestore(_storable(mems)),
                    data=ocp.args.JsonRestore(),
                    meta=ocp.args.JsonRestore(),
                ),
            )
        )
        saved = restored["mems"]
        restored["mems"] = type(mems)(saved.get("states", mems.states), saved["valid"])
        return restored

    def restore_params(self, step: int, state: Any) -> Any:
        """Only the ``state`` item (evaluation does not need memory or data)."""
        return self.manager.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(state))
        )["state"]

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def close(self) -> None:
        self.manager.close()


def latest_step(directory: str | pathlib.Path) -> int | None:
    """The newest complete checkpoint under ``directory`` without creating anything (or None)."""
    path = pathlib.Path(directory)
    steps = (
        [int(p.name) for p in path.iterdir() if p.is_dir() and p.name.isdigit()]
        if path.is_dir()
        else []
    )
    return max(steps, default=None)
