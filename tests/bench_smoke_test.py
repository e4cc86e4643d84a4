"""The benchmarks stay runnable: each runs once at toy sizes and prints its table."""

from __future__ import annotations

import pathlib
import subprocess
import sys

import pytest

ROOT = pathlib.Path(__file__).resolve().parent.parent


@pytest.mark.slow
def test_bench_positions_runs():
    result = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "positions.py"), "--lengths", "16", "--repeats", "1"],
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
    )
    rows = [
        line
        for line in result.stdout.splitlines()
        if line.startswith("| txl") or line.startswith("| shaw")
    ]
    assert len(rows) == 2, result.stdout
