"""End to end on a tiny generated corpus: train, checkpoint, resume exactly, evaluate, CLI errors."""

from __future__ import annotations

import dataclasses
import json
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

from relpos_jax.config import ConfigError, MeshConfig
from relpos_jax.eval_results import going_on, load_windows, split_progress
from relpos_jax.evaluate import restore_model, run_eval
from relpos_jax.train import Trainer
from tests.helpers import ROOT, evaluation_stopped_before_call, logged_losses, run_cli, tiny_flags


@pytest.mark.slow
def test_train_resume_and_evaluate(tiny, tmp_path, monkeypatch):
    config, _ = tiny
    straight = Trainer(config, tmp_path / "straight").run()
    assert straight["step"] == 8 and np.isfinite(straight["valid_bpc"])
    losses = logged_losses(tmp_path / "straight")
    assert [s for s, _ in losses] == list(range(1, 9))

    interrupted = Trainer(config, tmp_path / "resumed")
    assert interrupted.resumed_from is None and interrupted.run(stop_after=5) is None
    resumed = Trainer(config, tmp_path / "resumed")
    assert resumed.resumed_from == 5
    resumed.run()
    # Parameters, optimizer, memory, dropout RNG and data position all came back: same losses.
    assert logged_losses(tmp_path / "resumed") == losses

    model, cfg, step = restore_model(config, tmp_path / "resumed")
    results = run_eval(model, cfg, ["valid", "test"])
    assert step == 8
    assert results["settings"]["mem_len"] == 20 and results["settings"]["segment_len"] == 6
    text_len = len((pathlib.Path(config.data.path)).read_bytes())
    assert (
        results["valid"]["tokens"] + results["test"]["tokens"]
        == (text_len - int(text_len * 0.9)) - 2
    )
    assert results["valid"]["bpc"] < 8.0  # better than uniform over bytes
    _stopped_and_run_again_evaluates_the_same(model, cfg, step, tmp_path / "resumed", results,
                                              monkeypatch)  # fmt: skip
    # trained on a mesh this machine does not have (8 data devices): evaluated all the same
    elsewhere = run_eval(model, dataclasses.replace(cfg, mesh=MeshConfig(data=8)), ["valid"])
    assert elsewhere["valid"]["bpc"] == pytest.approx(results["valid"]["bpc"], rel=1e-6)


def _stopped_and_run_again_evaluates_the_same(model, cfg, step, workdir, results, monkeypatch):
    """eval.py's passes kept as they go (``split_progress``, here after every call): stopped in the
    valid split's third call and run again, valid goes on from its two calls kept, test from its
    first token, to the same results bit for bit; each pass kept whole until ``done``."""

    def progress():
        kept = {s: split_progress(workdir, cfg, s, step) for s in ("valid", "test")}
        for p in kept.values():
            p.every_s = 0
        return kept

    with evaluation_stopped_before_call(monkeypatch, 2):
        run_eval(model, cfg, ["valid", "test"], progress())
    first = going_on("2026-12-08 01:00:00", progress())
    valid_kept = progress()["valid"].resumed()[1][0]["row_count"].sum()
    assert first == (
        f"going on with the evaluation started 2026-12-08 01:00:00: valid after its "
        f"{int(valid_kept):,} tokens scored, test from the first token"
    )
    again = run_eval(model, cfg, ["valid", "test"], progress())
    for split in ("valid", "test"):
        assert again[split]["loss"] == results[split]["loss"], split
        np.testing.assert_array_equal(again[split]["windows"]["bits"],
                                      results[split]["windows"]["bits"])  # fmt: skip
        kept = progress()[split]
        assert kept.path.name == f"eval_{split}.progress.npz" and kept.resumed()[0] > 0
        kept.done()
    assert going_on("then", progress()).startswith("restarting the evaluation from the first token")


@pytest.mark.slow
def test_no_memory_run_checkpoints_and_resumes(tiny, tmp_path):
    config, _ = tiny
    config = config.copy_and_resolve_references()
    config.model.mem_len = 0
    assert Trainer(config, tmp_path).run(stop_after=2) is None
    resumed = Trainer(config, tmp_path)
    assert resumed.resumed_from == 2 and resumed.mems.states.shape[2] == 0
    assert resumed.run()["step"] == 8


@pytest.mark.slow
def test_gradient_accumulation_equals_the_whole_batch(tiny, tmp_path):
    config, _ = tiny
    config = config.copy_and_resolve_references()
    config.model.dropout = 0.0
    Trainer(config, tmp_path / "whole").run(stop_after=3)
    config.train.grad_accum = 2
    Trainer(config, tmp_path / "micro").run(stop_after=3)
    whole, micro = logged_losses(tmp_path / "whole"), logged_losses(tmp_path / "micro")
    assert [s for s, _ in micro] == [1, 2, 3]
    np.testing.assert_allclose([l for _, l in micro], [l for _, l in whole], rtol=1e-5)
    config.train.grad_accum = 3
    with pytest.raises(ConfigError, match=r"train\.grad_accum=3"):
        Trainer(config, tmp_path / "bad")


@pytest.mark.slow
@pytest.mark.parametrize(
    ("flag", "names"),
    [
        ("--config.model.n_head=3", "n_head"),
        ("--config.data.name=wikitext9", "data.name='wikitext9'"),
        ("--config.model.n_heads=3", "model.n_heads=3"),
    ],
)
def test_cli_errors_are_one_line(tmp_path, flag, names):
    result = run_cli(
        "train.py", "--config", "configs/txl_small.py", "--workdir", str(tmp_path), flag
    )
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and names in errors[0], result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.slow
def test_a_config_files_own_error_is_the_one_line(tmp_path):
    """A config file that refuses its argument (``rope_pi.py:<factor>,<extension>``): its reason,
    not absl's "Error whilst parsing config file"."""
    result = run_cli("train.py", "--config", "configs/rope_pi.py:4,pi", "--workdir", str(tmp_path))
    assert result.returncode == 2, result.stderr
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "kind='pi' is not a RoPE stretch; use one of" in errors[0], errors
    assert "configs/rope_pi.py:4,pi" in errors[0] and "Traceback" not in result.stderr


@pytest.mark.slow
def test_eval_cli_without_checkpoint(tmp_path):
    result = run_cli("eval.py", "--config", "configs/txl_small.py", "--workdir", str(tmp_path))
    assert result.returncode == 2 and "holds no checkpoint" in result.stderr


@pytest.mark.slow
def test_the_cli_trains_then_resumes_and_evaluates_on_other_device_counts(tiny, tmp_path):
    """Trained on two CPU devices (one per core), resumed on one, then evaluated on two and on one
    (with a sample): the same scores."""
    config, _ = tiny
    flags = tiny_flags(config, tmp_path)
    two = run_cli("train.py", *flags, "--config.train.steps=2", JAX_NUM_CPU_DEVICES="2")
    assert two.returncode == 0, two.stderr
    assert two.stdout.splitlines()[0].startswith("training txl on text from scratch")
    # Not a terminal: one plain line per log step, no redrawn bar.
    assert re.search(r"^step 2/2: loss \d+\.\d+, bpc \d+\.\d+, [\d,]+ tokens/s$", two.stdout, re.M)
    assert "\r" not in two.stdout + two.stderr and "it/s" not in two.stderr
    one = run_cli("train.py", *flags, "--config.train.steps=4", JAX_NUM_CPU_DEVICES="1")
    assert one.returncode == 0, one.stderr
    assert one.stdout.splitlines()[0].startswith("resuming from step 2")
    # 4 rows: the batch and the key/value memory split over two devices, then on one: same scores
    scores, windows = {}, {}
    for devices, more in (("2", []), ("1", ["--sample", "8"])):
        evaluated = run_cli(
            "eval.py", *flags, "--config.eval.batch_size=4", *more, JAX_NUM_CPU_DEVICES=devices
        )
        assert evaluated.returncode == 0, evaluated.stderr
        scores[devices] = json.loads((tmp_path / "eval.json").read_text())
        windows[devices] = {s: load_windows(tmp_path, s) for s in ("valid", "test")}
    assert scores["2"]["step"] == scores["1"]["step"] == 4
    for split in ("valid", "test"):
        assert scores["2"][split]["tokens"] == scores["1"][split]["tokens"]
        assert scores["2"][split]["bpc"] == pytest.approx(scores["1"][split]["bpc"], rel=1e-5)
        # each row of each segment beside eval.json, in the same order on one device and on two
        two, one = windows["2"][split], windows["1"][split]
        assert two["layout"] == one["layout"] == scores["1"][split]["windows"]["layout"]
        np.testing.assert_array_equal(two["tokens"], one["tokens"])
        np.testing.assert_allclose(two["bits"], one["bits"], rtol=1e-4)
        assert two["tokens"].sum() == scores["1"][split]["tokens"]


@pytest.mark.slow
def test_sigterm_saves_at_the_next_step_and_the_same_command_resumes(tiny, tmp_path):
    import signal
    import time

    config, _ = tiny
    flags = [
        *tiny_flags(config, tmp_path),
        "--config.train.log_every=1",
        "--config.train.ckpt_every=0",
    ]
    command = [sys.executable, "train.py", *flags, "--config.train.steps=100000"]
    process = subprocess.Popen(
        command, cwd=ROOT, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    deadline = time.time() + 240
    while time.time() < deadline and len(logged_losses(tmp_path)) < 3:
        time.sleep(0.5)
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 0, err[-2000:]
    assert "received SIGTERM: saved a checkpoint at step" in out and "Traceback" not in err
    saved = int(out.split("saved a checkpoint at step ")[1].split()[0])
    assert saved >= 3
    from relpos_jax.checkpoint import latest_step

    assert latest_step(tmp_path / "checkpoints") == saved
    again = run_cli("train.py", *flags, f"--config.train.steps={saved + 2}")
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines()[0] == (
        f"resuming from step {saved} in {tmp_path} (pass another --workdir to start fresh)"
    )
