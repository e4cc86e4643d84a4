"""What train.py and eval.py share: flags, the work directory, and one-line errors.

A mistake in a flag, a config value or a dataset ends in one line that names the field and the fix,
exit code 2, and no traceback.
"""

from __future__ import annotations

import pathlib
import sys

from absl import flags, logging
from ml_collections import config_flags

from relpos_jax.config import ConfigError
from relpos_jax.data import DataError

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file, e.g. configs/txl_small.py.", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Work directory (default runs/<config name>).")


def parse_flags(argv: list[str]) -> list[str]:
    """absl flag parsing, with its errors turned into one line and exit code 2."""
    logging.set_verbosity(logging.WARNING)  # no absl INFO lines (backend probing) before ours
    try:
        return flags.FLAGS(argv)
    except (flags.Error, KeyError, AttributeError, ValueError, TypeError) as error:
        message = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        exit_with(f"flags: {message}; check the spelling against configs/base.py")


def config():
    if _CONFIG.value is None:
        exit_with("--config is required; e.g. --config configs/txl_small.py")
    return _CONFIG.value


def workdir() -> pathlib.Path:
    if _WORKDIR.value:
        return pathlib.Path(_WORKDIR.value)
    name = pathlib.Path(flags.FLAGS["config"].config_filename).stem
    return pathlib.Path("runs") / name


def exit_with(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


USER_ERRORS = (ConfigError, DataError)
