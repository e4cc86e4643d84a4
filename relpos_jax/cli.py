"""What train.py and eval.py share: flags, the work directory, and one-line errors.

A mistake in a flag, a config value or a dataset ends in one line that names the field and the fix,
exit code 2, and no traceback.
"""

from __future__ import annotations

import os
import pathlib
import sys
from typing import Any

from absl import flags, logging
from ml_collections import config_flags

from relpos_jax.checkpoint import CheckpointError
from relpos_jax.config import ConfigError
from relpos_jax.data import DataError

_CONFIG = config_flags.DEFINE_config_file(
    "config", None, "Config file, e.g. configs/txl_small.py.", lock_config=True
)
_WORKDIR = flags.DEFINE_string("workdir", None, "Work directory (default runs/<config name>).")
_COORDINATOR = flags.DEFINE_string(
    "coordinator_address", None, "host:port of process 0 (multi-process)."
)
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Number of processes (multi-process).")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "This process's index (multi-process).")
_DISTRIBUTED = flags.DEFINE_boolean(
    "distributed",
    False,
    "Initialise JAX's multi-controller runtime from the cluster (TPU pod, SLURM).",
)


def initialize_distributed() -> None:
    """``jax.distributed.initialize`` when flags or the environment ask for it; nothing otherwise.

    Explicit flags win; ``--distributed`` (or SLURM with several tasks, or a multi-host TPU slice)
    lets JAX detect the coordinator, process count and id itself.
    """
    import jax

    if not distributed_requested():
        return
    jax.config.update("jax_cpu_collectives_implementation", "gloo")  # CPU collectives across hosts
    if _COORDINATOR.value is not None:
        if _NUM_PROCESSES.value is None or _PROCESS_ID.value is None:
            exit_with("--coordinator_address needs --num_processes and --process_id")
        jax.distributed.initialize(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
    else:
        jax.distributed.initialize()


def distributed_requested() -> bool:
    """Whether flags or the environment ask for several processes."""
    slurm = int(os.environ.get("SLURM_NTASKS", "1")) > 1
    tpu_pod = "," in os.environ.get("TPU_WORKER_HOSTNAMES", "")
    return _COORDINATOR.value is not None or _DISTRIBUTED.value or slurm or tpu_pod


def split_cpu_into_cores(config) -> None:
    """One CPU device per core (``cpu_devices``) for a single-process run of ``config``; before
    JAX's first computation."""
    from relpos_jax.config import Config
    from relpos_jax.ops import cpu_devices

    if distributed_requested():
        return
    try:
        cfg = Config.from_any(config)
    except ConfigError:
        return  # the run reports the invalid config itself, in one line
    rows = cfg.data.batch_size // cfg.train.grad_accum
    cpu_devices.one_device_per_core((cfg.data.batch_size, rows, cfg.eval.batch_size), cfg.mesh)


def parse_flags(argv: list[str]) -> list[str]:
    """absl flag parsing, with its errors turned into one line and exit code 2."""
    logging.set_verbosity(logging.WARNING)  # no absl INFO lines (backend probing) before ours
    try:
        return flags.FLAGS(argv)
    except (flags.Error, KeyError, AttributeError, ValueError, TypeError) as error:
        lines = str(error).strip().splitlines() or [type(error).__name__]
        reasons = [line.strip() for line in lines[1:] if "Error: " in line]
        if lines[0].endswith("Error whilst parsing config file:") and reasons:  # the file's own
            flag, reason = lines[0].split(": Error whilst")[0], reasons[-1].split("Error: ", 1)[1]
            exit_with(f"{flag}: {reason}")
        exit_with(f"flags: {lines[0]}; check the spelling against configs/base.py")


def config():
    if _CONFIG.value is None:
        exit_with("--config is required; e.g. --config configs/txl_small.py")
    return _CONFIG.value


def config_path() -> str:
    return flags.FLAGS["config"].config_filename


def workdir() -> pathlib.Path:
    if _WORKDIR.value:
        return pathlib.Path(_WORKDIR.value)
    return pathlib.Path("runs") / pathlib.Path(config_path()).stem


def say(message: str) -> None:
    """Print from process 0 only."""
    import jax

    if jax.process_index() == 0:
        print(message, flush=True)


def exit_with(message: str) -> None:
    print(f"error: {message}", file=sys.stderr)
    sys.exit(2)


def exit_with_device_failure(error: Any, workdir: pathlib.Path) -> None:
    """An ``errors.AcceleratorError`` in one line; the device's own message goes to
    ``workdir/error.log``."""
    log = pathlib.Path(workdir) / "error.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    log.write_text(f"{error}\n\n{error.detail}\n")
    exit_with(f"{error} (the device's own message: {log})")


USER_ERRORS = (ConfigError, DataError, CheckpointError)
