"""``python tests/kill_during_save.py STEP <train.py flags>``: train.py, SIGKILLed during a save.

The process kills itself at the moment orbax renames the finished checkpoint of ``STEP`` into place:
every file of it is written, the commit is not done. A kill cannot land later in a save and still
lose it, so this is the worst case for "a kill during a checkpoint write".
"""

from __future__ import annotations

import os
import pathlib
import runpy
import signal
import sys

ROOT = pathlib.Path(__file__).resolve().parent.parent


def main() -> None:
    step, flags = sys.argv[1], sys.argv[2:]
    real_rename = os.rename

    def rename(src, dst, *args, **kwargs):
        target = pathlib.Path(dst)
        if target.name == step and target.parent.name == "checkpoints":
            os.kill(os.getpid(), signal.SIGKILL)
        return real_rename(src, dst, *args, **kwargs)

    os.rename = rename
    sys.path.insert(0, str(ROOT))
    sys.argv = [str(ROOT / "train.py"), *flags]
    runpy.run_path(str(ROOT / "train.py"), run_name="__main__")


if __name__ == "__main__":
    main()
