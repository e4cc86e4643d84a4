"""Resume on every path and mesh: a run SIGKILLed mid-way and started again with the same command
logs the uninterrupted run's losses, bitwise, through the tiled attention, the Pallas kernels
(interpreted on a CPU), gradient accumulation and a context-parallel mesh of 8 CPU devices; and a
run killed on 8 devices, resumed on 4 and finished on 1 logs the one-device run's losses within
float tolerance (the sums run in another order)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from tests.helpers import ROOT, kill_when_logged, logged_losses, run_cli, tiny_flags

STEPS = 12
PATHS = {
    "tiled": (["--config.model.attention_impl=tiled", "--config.model.key_tile=4",
               "--config.model.query_tile=4"], 1),
    "kernel, interpreted": (["--config.model.attention_impl=kernel"], 1),
    "grad_accum 2": (["--config.train.grad_accum=2"], 1),
    "context 2, 8 devices": (["--config.mesh.context=2", "--config.model.attention_impl=tiled",
                              "--config.model.key_tile=4", "--config.model.query_tile=4"], 8),
}  # fmt: skip


def _flags(config, workdir, extra):
    return [
        *tiny_flags(config, workdir), f"--config.train.steps={STEPS}",
        "--config.train.log_every=1", "--config.train.ckpt_every=1", "--config.model.dropout=0.1",
        *extra,
    ]  # fmt: skip


def _killed_after(flags, workdir, records: int, devices: int) -> None:
    """train.py with ``flags`` on ``devices`` CPU devices, SIGKILLed once ``records`` losses are
    logged."""
    command = [sys.executable, "train.py", *flags]
    code = kill_when_logged(command, workdir, records, JAX_NUM_CPU_DEVICES=str(devices))
    assert code == -signal.SIGKILL, "the run ended before it could be killed"


@pytest.mark.slow
@pytest.mark.parametrize("path", sorted(PATHS))
def test_sigkill_then_the_same_command_logs_the_same_losses(tiny, tmp_path, path):
    config, _ = tiny
    extra, devices = PATHS[path]
    straight, killed = tmp_path / "straight", tmp_path / "killed"
    devices_env = {"JAX_NUM_CPU_DEVICES": str(devices)}
    done = run_cli("train.py", *_flags(config, straight, extra), **devices_env)
    assert done.returncode == 0, done.stderr[-2000:]
    expected = dict(logged_losses(straight))
    assert sorted(expected) == list(range(1, STEPS + 1))
    _killed_after(_flags(config, killed, extra), killed, 4, devices)
    resumed = run_cli("train.py", *_flags(config, killed, extra), **devices_env)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming from step" in resumed.stdout
    logged = logged_losses(killed)
    assert {step for step, _ in logged} == set(expected)
    assert all(loss == expected[step] for step, loss in logged), (logged, expected)


@pytest.mark.slow
def test_a_run_killed_on_8_devices_resumes_on_4_and_finishes_on_1(tiny, tmp_path):
    config, _ = tiny
    batch = ["--config.data.batch_size=8"]  # rows for each of 8 devices
    one, moved = _flags(config, tmp_path / "one", batch), _flags(config, tmp_path / "moved", batch)
    done = run_cli("train.py", *one, JAX_NUM_CPU_DEVICES="1")
    assert done.returncode == 0, done.stderr[-2000:]
    expected = dict(logged_losses(tmp_path / "one"))
    _killed_after(moved, tmp_path / "moved", 3, devices=8)
    _killed_after(moved, tmp_path / "moved", 6, devices=4)
    finished = run_cli("train.py", *moved, JAX_NUM_CPU_DEVICES="1")
    assert finished.returncode == 0, finished.stderr[-2000:]
    logged = logged_losses(tmp_path / "moved")
    assert {step for step, _ in logged} == set(expected)
    for step, loss in logged:
        np.testing.assert_allclose(loss, expected[step], rtol=1e-5, err_msg=f"step {step}")


@pytest.mark.slow
def test_an_evaluation_killed_mid_way_says_in_its_first_line_that_it_restarts(tiny, tmp_path):
    config, _ = tiny
    workdir = tmp_path / "run"
    flags = [*_flags(config, workdir, []), "--config.train.steps=2"]
    assert run_cli("train.py", *flags).returncode == 0
    process = subprocess.Popen(
        [sys.executable, "eval.py", *flags], cwd=ROOT,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.time() + 240
    while time.time() < deadline and not (workdir / "eval.running").exists():
        time.sleep(0.01)
    process.send_signal(signal.SIGKILL)
    assert process.wait(timeout=60) == -signal.SIGKILL
    assert not (workdir / "eval.json").exists()
    again = run_cli("eval.py", *flags)
    assert again.returncode == 0, again.stderr[-2000:]
    first = again.stdout.splitlines()[0]
    assert first.startswith("restarting the evaluation from the first token: the one started")
    assert (workdir / "eval.json").exists() and not (workdir / "eval.running").exists()
    assert not list(workdir.glob("eval_*.progress.npz"))  # the passes' progress, gone once saved
    recorded = json.loads((workdir / "eval.json").read_text())["data"]  # what sweeps reuse it by
    assert recorded == {"name": "text", "partition": "dedup", "python": None}
