"""What the benchmarks share: the repository and its commit, the CPU, model sizes, a median timer,
our model, subprocesses.

Every speed measurement runs in a fresh subprocess (``isolated``), so that its peak resident memory
is its own and no compilation cache or thread pool carries over from the one before; the subprocess
is the same module, ``python -m bench.<name> --worker <json spec>`` at the repository root, answered
through ``parse_or_serve``.
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import platform
import resource
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent  # the repository: configs/, train.py, runs/
SIZES = {
    "small": dict(layers=6, d_model=256, heads=4, d_ff=1024, seg=128, mem=128, batch=16),
    "base": dict(layers=12, d_model=512, heads=8, d_ff=2048, seg=512, mem=512, batch=22),  # enwik8
    "large": dict(layers=24, d_model=1024, heads=16, d_ff=4096, seg=512, mem=512, batch=16),
    "tiny": dict(layers=1, d_model=32, heads=2, d_ff=64, seg=16, mem=16, batch=2),  # smoke tests
}
VOCAB = 256


def commit() -> str:
    """The repository's short commit, which each result records."""
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, cwd=ROOT
    ).stdout.strip()


def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo``), else the machine's architecture."""
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.machine()


def machine() -> str:
    """The machine as the results record it: its CPU model and number of cores."""
    return f"{cpu_model()}, {os.cpu_count()} cores"


def median_seconds(call, repeats: int, warmup: int) -> float:
    for _ in range(warmup):
        call()
    durations = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        durations.append(time.perf_counter() - start)
    return statistics.median(durations)


def our_model(scheme: str, size: dict, **overrides):
    """A relpos_jax ``TransformerLM`` of ``size`` (a ``SIZES`` entry) with model-config overrides."""
    from flax import nnx

    from relpos_jax import TransformerLM

    config = dict(
        position=scheme, n_layers=size["layers"], d_model=size["d_model"], n_heads=size["heads"],
        d_ff=size["d_ff"], mem_len=size["mem"], dropout=0.0,
    )  # fmt: skip
    return TransformerLM({**config, **overrides}, rngs=nnx.Rngs(0))


def isolated(module: str, spec: dict) -> dict:
    """Runs ``python -m module --worker spec`` (``module`` e.g. ``bench.speed``) at the repository
    root and returns its JSON answer, or ``{"error": one line}``."""
    command = [sys.executable, "-m", module, "--worker", json.dumps(spec)]
    result = subprocess.run(command, capture_output=True, text=True, check=False, cwd=ROOT)
    if result.returncode:
        errors = [line for line in result.stderr.splitlines() if "Error" in line] or ["failed"]
        return {"error": errors[-1][:120]}
    return json.loads(result.stdout.strip().splitlines()[-1])


def parse_or_serve(parser: argparse.ArgumentParser, compute):
    """The command line's arguments; or, in a worker (``--worker <json spec>``, from ``isolated``),
    prints ``compute(spec)`` with the peak resident MiB and returns None."""
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if not args.worker:
        return args
    spec = json.loads(args.worker)
    if spec.get("library", "relpos_jax") == "relpos_jax":
        from relpos_jax.ops import host_memory

        host_memory.reuse_freed_memory()  # what train.py does; before the first computation
    result = compute(spec)
    result["peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(result))
    return None


def cell(result: dict, key: str, fmt: str = ",.0f") -> str:
    return f"error: {result['error']}" if "error" in result else format(result[key], fmt)
