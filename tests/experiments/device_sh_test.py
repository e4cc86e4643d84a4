"""``experiments/device.sh``, the sweeps' entry on an accelerator machine, at toy size on this CPU:
the sweep's runs side by side, those that start from another's checkpoint after it, then the sweep
itself, which finds every run done."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT


@pytest.mark.slow
def test_device_sh_runs_a_sweeps_runs_side_by_side_then_the_sweep_tabulates_them(tmp_path):
    sizes = ["model.n_layers=1", "model.d_model=32", "model.d_ff=64", "model.n_heads=2"]
    sweep = [
        "experiments.extrapolation", "--schemes", "rope,alibi", "--seeds", "0", "--steps", "3",
        "--pi-steps", "2", "--factors", "1,2", "--tokens", "4096", "--train-len", "16",
        "--variants", "defaults", "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out"),
        *(f"--set={s}" for s in sizes),
    ]  # fmt: skip
    env = {**os.environ, "PYTHON": sys.executable, "OUT": str(tmp_path / "log")}
    result = subprocess.run(
        ["bash", "experiments/device.sh", "-P", "2", *sweep],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    log = (tmp_path / "log" / "device.log").read_text()
    started = [line.split(": ", 1)[1] for line in log.splitlines() if "] run " in line]
    names = [s.rsplit("/", 1)[1] for s in started]
    assert sorted(names[:2]) == ["alibi_defaults_len16_seed0", "rope_defaults_len16_seed0"]
    assert names[2:] == ["rope_pi2_len16_seed0"]  # the fine-tune after the run it starts from
    assert "failed" not in log
    for name in names:  # the sweep found each run done: it trained nothing itself
        assert f"{name}: done" in result.stderr + log
    assert (tmp_path / "out" / "extrapolation.md").is_file()
