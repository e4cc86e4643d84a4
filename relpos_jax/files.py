"""Files written whole: a stopped process leaves the old file or the new one, never half of one."""

from __future__ import annotations

import os
import pathlib


def replace_whole(path: pathlib.Path, write) -> None:
    """``path`` as ``write(file)`` writes it: into a temporary file beside it, then renamed into
    place, so that a stopped process leaves the old file or the new one, never half of one."""
    temporary = path.with_name(f".{path.name}.tmp")
    with temporary.open("wb") as f:
        write(f)
    os.replace(temporary, path)
