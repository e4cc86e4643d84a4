"""Runs that survive kills, corrupt checkpoints, NaNs and a checkpoint from another config.

The yardstick is always the run that was never interrupted: a run killed (SIGKILL) at any point and
started again with the same command must log the same losses, step for step, bitwise.
"""

from __future__ import annotations

import pathlib
import shutil
import signal
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from relpos_jax import train as train_lib
from relpos_jax.checkpoint import CheckpointError, latest_step
from relpos_jax.config import ConfigError
from relpos_jax.metrics import MetricsWriter, read_metrics
from relpos_jax.train import NonFiniteLoss, Trainer
from tests.helpers import ROOT, logged_losses, run_cli, tiny_flags

# ----------------------------------------------------------------------------- kills (SIGKILL)


def _kill_when_logged(command: list[str], workdir: pathlib.Path, records: int) -> int:
    """Start ``command``, SIGKILL it once metrics.jsonl holds ``records`` losses; its exit code."""
    process = subprocess.Popen(
        command, cwd=ROOT, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    deadline = time.time() + 240
    while time.time() < deadline and process.poll() is None:
        if len(logged_losses(workdir)) >= records:
            process.send_signal(signal.SIGKILL)
            break
        time.sleep(0.01)
    return process.wait(timeout=60)


@pytest.mark.slow
def test_sigkill_anywhere_then_the_same_command_logs_the_same_losses(tiny, tmp_path):
    config, _ = tiny
    steps = 30

    def flags(workdir):
        return [
            *tiny_flags(config, workdir),
            f"--config.train.steps={steps}",
            "--config.train.log_every=1",
            "--config.train.ckpt_every=1",
            "--config.model.dropout=0.1",
        ]

    straight, killed = tmp_path / "straight", tmp_path / "killed"
    assert run_cli("train.py", *flags(straight)).returncode == 0
    expected = dict(logged_losses(straight))
    assert sorted(expected) == list(range(1, steps + 1))

    # SIGKILL at three points while steps and (asynchronous) checkpoint writes are under way ...
    kills = 0
    for records in (4, 12, 20):
        code = _kill_when_logged([sys.executable, "train.py", *flags(killed)], killed, records)
        kills += code == -signal.SIGKILL
    assert kills == 3
    # ... and once at the worst moment of a save: its files written, the commit (rename) not done.
    before = latest_step(killed / "checkpoints")
    commit = subprocess.run(
        [sys.executable, "tests/kill_during_save.py", str(before + 1), *flags(killed)],
        cwd=ROOT,
        capture_output=True,
        timeout=300,
    )
    assert commit.returncode == -signal.SIGKILL
    assert latest_step(killed / "checkpoints") == before  # the half-saved one is not a checkpoint
    assert any(".orbax-checkpoint-tmp" in p.name for p in (killed / "checkpoints").iterdir())

    resumed = run_cli("train.py", *flags(killed))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resuming from step {before}" in resumed.stdout
    # Every loss any of the five processes logged (steps redone after a kill included) is the
    # uninterrupted run's loss at that step, bitwise; and every step was logged.
    logged = logged_losses(killed)
    assert {step for step, _ in logged} == set(expected)
    assert all(loss == expected[step] for step, loss in logged), logged
    valid = [m["valid/bpc"] for m in read_metrics(killed) if "valid/bpc" in m]
    assert valid[-1] == [m["valid/bpc"] for m in read_metrics(straight) if "valid/bpc" in m][-1]


# ----------------------------------------------------------------------------- corrupt checkpoints


@pytest.fixture(scope="module")
def stopped_at_6(tiny, tmp_path_factory):
    """A run of 8 steps stopped at step 6 (checkpoints 2, 4, 6) and the straight run's losses."""
    config, _ = tiny
    config = config.copy_and_resolve_references()
    config.train.update(ckpt_every=2, eval_every=0)
    root = tmp_path_factory.mktemp("stopped")
    Trainer(config, root / "straight").run()
    assert Trainer(config, root / "stopped").run(stop_after=6) is None
    return config, root / "stopped", dict(logged_losses(root / "straight"))


def _files(folder: pathlib.Path) -> list[pathlib.Path]:
    return sorted(p for p in folder.rglob("*") if p.is_file())


def _garble(step_dir):
    for path in _files(step_dir / "state"):
        if "/d/" in str(path):  # array data chunks
            path.write_bytes(np.random.default_rng(0).bytes(path.stat().st_size))


def _truncate(step_dir):
    for path in _files(step_dir / "state"):
        if "/d/" in str(path):
            path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


CORRUPTIONS = {
    "array data overwritten": _garble,
    "array data truncated": _truncate,
    "state metadata deleted": lambda d: (d / "state" / "_METADATA").unlink(),
    "meta json cut short": lambda d: (d / "meta" / "metadata").write_text('{"step": 6, "con'),
    "step folder emptied": lambda d: [
        shutil.rmtree(p) if p.is_dir() else p.unlink() for p in list(d.iterdir())
    ],
}


@pytest.mark.slow
@pytest.mark.parametrize("corruption", sorted(CORRUPTIONS))
def test_corrupt_newest_checkpoint_falls_back_to_the_one_before(
    stopped_at_6, tmp_path, capsys, corruption
):
    config, stopped, expected = stopped_at_6
    workdir = tmp_path / "run"
    shutil.copytree(stopped, workdir)
    CORRUPTIONS[corruption](workdir / "checkpoints" / "6")
    trainer = Trainer(config, workdir)
    assert trainer.resumed_from == 4
    warning = capsys.readouterr().err
    assert "the checkpoint at step 6" in warning and "cannot be read" in warning
    assert "using step 4" in warning
    (moved,) = (workdir / "corrupt").iterdir()  # set aside, not deleted
    assert moved.name.startswith("6-") and not (workdir / "checkpoints" / "6").exists()
    trainer.run()
    redone = [(s, loss) for s, loss in logged_losses(workdir) if s > 6]
    assert redone == [(s, expected[s]) for s in (7, 8)]
    assert latest_step(workdir / "checkpoints") == 8


@pytest.mark.slow
def test_no_readable_checkpoint_is_one_line_and_moves_nothing(stopped_at_6, tmp_path):
    config, stopped, _ = stopped_at_6
    workdir = tmp_path / "run"
    shutil.copytree(stopped, workdir)
    for step in (2, 4, 6):
        (workdir / "checkpoints" / str(step) / "state" / "_METADATA").unlink()
    with pytest.raises(CheckpointError) as error:
        Trainer(config, workdir)
    message = str(error.value)
    assert "none of its 3 checkpoints can be read" in message and "\n" not in message
    assert sorted(p.name for p in (workdir / "checkpoints").iterdir()) == ["2", "4", "6"]


@pytest.mark.slow
@pytest.mark.parametrize(
    ("section", "field", "value", "names"),
    [
        ("model", "d_model", 64, "model.d_model=64 is invalid; the checkpoint at step 6"),
        ("model", "position", "rope", "written with model.position='txl'"),
        ("data", "batch_size", 2, "data.batch_size=2 is invalid"),
        ("train", "clip", 0.0, "holds 1/opt_state/inner_state/0"),  # optimizer structure
    ],
)
def test_checkpoint_of_another_config_is_one_line(stopped_at_6, section, field, value, names):
    config, stopped, _ = stopped_at_6
    config = config.copy_and_resolve_references()
    config[section][field] = value
    before = _files(stopped)
    with pytest.raises(ConfigError) as error:
        Trainer(config, stopped)
    assert names in str(error.value) and "\n" not in str(error.value), str(error.value)
    assert _files(stopped) == before


@pytest.mark.slow
def test_cli_resume_with_another_d_model_exits_2_in_one_line(stopped_at_6, tmp_path):
    config, stopped, _ = stopped_at_6
    shutil.copytree(stopped, tmp_path / "run")
    flags = tiny_flags(config, tmp_path / "run")
    result = run_cli("train.py", *flags, "--config.model.d_model=64", "--config.model.n_heads=2")
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and len(errors) == 1, result.stderr[-2000:]
    assert "model.d_model=64 is invalid" in errors[0] and "Traceback" not in result.stderr


# ----------------------------------------------------------------------------- NaN / Inf


def _marked_corpus(config, tmp_path, steps: tuple[int, ...]):
    """The tiny corpus with a '~' in row 0's inputs at each of ``steps`` (1-based)."""
    text = bytearray(pathlib.Path(config.data.path).read_bytes())
    segment = config.data.segment_len
    for step in steps:
        text[(step - 1) * segment + 2] = ord("~")
    (tmp_path / "marked.txt").write_bytes(bytes(text))
    config = config.copy_and_resolve_references()
    config.data.update(path=str(tmp_path / "marked.txt"), dir=str(tmp_path / "tfds"))
    config.train.update(ckpt_every=2, eval_every=0)
    return config


_REAL_LOSS = train_lib._loss


def _nan_loss_at_marks(model, inputs, targets, mems):
    loss, new_mems = _REAL_LOSS(model, inputs, targets, mems)
    return jnp.where(jnp.any(inputs == ord("~")), jnp.nan, loss), new_mems


def _nan_gradient_at_marks(model, inputs, targets, mems):
    """Finite loss, NaN gradient: d sqrt(x)/dx at 0 is inf, times a zero derivative."""
    loss, new_mems = _REAL_LOSS(model, inputs, targets, mems)
    zero = jnp.where(jnp.any(inputs == ord("~")), 0.0, 1.0) * (1.0 + 0.0 * loss)
    return loss + jnp.sqrt(zero) - jnp.sqrt(jax.lax.stop_gradient(zero)), new_mems


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fault", "quantity"),
    [(_nan_loss_at_marks, "loss is nan"), (_nan_gradient_at_marks, "gradient norm is nan")],
)
def test_nonfinite_step_stops_the_run_and_keeps_the_last_good_checkpoint(
    tiny, tmp_path, monkeypatch, fault, quantity
):
    config = _marked_corpus(tiny[0], tmp_path, steps=(5,))
    monkeypatch.setattr(train_lib, "_loss", fault)
    with pytest.raises(NonFiniteLoss) as error:
        Trainer(config, tmp_path / "run").run()
    message = str(error.value)
    assert f"the {quantity} at step 5" in message and "checkpoint (step 4) is kept" in message
    assert latest_step(tmp_path / "run" / "checkpoints") == 4
    resumed = Trainer(config, tmp_path / "run")  # the kept checkpoint restores, finite
    params = jax.tree.leaves(nnx.state(resumed.current_model(), nnx.Param))
    assert all(np.isfinite(p).all() for p in params)


@pytest.mark.slow
def test_skip_nonfinite_changes_nothing_counts_and_goes_on(tiny, tmp_path, monkeypatch):
    config = _marked_corpus(tiny[0], tmp_path, steps=(3,))
    config.train.skip_nonfinite = True
    monkeypatch.setattr(train_lib, "_loss", _nan_loss_at_marks)
    before, after = Trainer(config, tmp_path / "a"), Trainer(config, tmp_path / "b")
    before.run(stop_after=2)
    after.run(stop_after=3)
    params = lambda t: jax.tree.leaves(nnx.state(t.current_model(), nnx.Param))  # noqa: E731
    for x, y in zip(params(before), params(after), strict=True):
        np.testing.assert_array_equal(x, y)  # the skipped step changed no parameter
    assert int(after.mems.valid) == 0  # and its memory was dropped
    summary = Trainer(config, tmp_path / "b").run()
    assert summary["skipped_steps"] == 1 and np.isfinite(summary["valid_bpc"])
    assert read_metrics(tmp_path / "b")[-2]["train/skipped_steps"] == 1


@pytest.mark.slow
def test_skip_nonfinite_stops_after_too_many_in_a_row(tiny, tmp_path, monkeypatch):
    config = _marked_corpus(tiny[0], tmp_path, steps=(3, 4, 5))
    config.train.update(skip_nonfinite=True, max_consecutive_skips=3)
    monkeypatch.setattr(train_lib, "_loss", _nan_loss_at_marks)
    with pytest.raises(NonFiniteLoss, match="at step 5, non-finite for 3 steps in a row"):
        Trainer(config, tmp_path / "run").run()
    assert latest_step(tmp_path / "run" / "checkpoints") == 4  # skipped steps 3, 4: still good


# ----------------------------------------------------------------------------- metrics file


def test_a_record_cut_by_a_kill_is_dropped_and_the_file_stays_valid(tmp_path):
    writer = MetricsWriter(tmp_path)
    writer.write(1, {"train/loss": 1.5})
    writer.close()
    with (tmp_path / "metrics.jsonl").open("a") as file:
        file.write('{"step": 2, "train/lo')  # the kill landed here
    writer = MetricsWriter(tmp_path)
    writer.write(2, {"train/loss": 1.25})
    writer.close()
    assert read_metrics(tmp_path) == [
        {"step": 1, "train/loss": 1.5},
        {"step": 2, "train/loss": 1.25},
    ]


# ----------------------------------------------------------------------------- data faults


def test_unreadable_file_in_a_text_folder_is_one_line(tmp_path, monkeypatch):
    from relpos_jax import data

    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_bytes(b"fine text\n" * 100)
    (tmp_path / "corpus" / "b.txt").write_bytes(b"\xff\xfe not utf-8 \x80" * 100)
    real_read = pathlib.Path.read_bytes

    def read_bytes(path):
        if path.name == "b.txt":
            raise PermissionError(13, "Permission denied", str(path))
        return real_read(path)

    monkeypatch.setattr(pathlib.Path, "read_bytes", read_bytes)
    with pytest.raises(data.DataError) as error:
        data.open_split("text", "train", path=str(tmp_path / "corpus"), data_dir=str(tmp_path))
    message = str(error.value)
    assert "b.txt" in message and "Permission denied" in message and "\n" not in message


@pytest.mark.slow
def test_a_dataset_that_became_empty_fails_in_one_line_and_damages_nothing(tiny, tmp_path):
    config, _ = tiny
    corpus = tmp_path / "corpus.txt"
    shutil.copy(config.data.path, corpus)
    flags = [
        *tiny_flags(config, tmp_path / "run"),
        f"--config.data.path={corpus}",
        "--config.train.steps=2",
    ]
    assert run_cli("train.py", *flags).returncode == 0
    written = {p: p.read_bytes() for p in _files(tmp_path / "run")}
    corpus.write_bytes(b"")  # emptied (or truncated) between two runs
    result = run_cli("train.py", *flags[:-1], "--config.train.steps=4")
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and len(errors) == 1 and "Traceback" not in result.stderr
    assert "data.batch_size=4 is invalid for a split of 0 tokens" in errors[0], errors
    assert {p: p.read_bytes() for p in _files(tmp_path / "run")} == written


@pytest.mark.slow
def test_evaluation_skips_a_corrupt_newest_checkpoint_and_moves_nothing(stopped_at_6, tmp_path):
    from relpos_jax.evaluate import restore_model

    config, stopped, _ = stopped_at_6
    workdir = tmp_path / "run"
    shutil.copytree(stopped, workdir)
    _truncate(workdir / "checkpoints" / "6")
    before = _files(workdir)
    _, _, step = restore_model(config, workdir)
    assert step == 4 and _files(workdir) == before


@pytest.mark.slow
def test_evaluation_restores_only_the_model_whatever_the_optimizer(stopped_at_6):
    from relpos_jax.evaluate import restore_model

    config, stopped, _ = stopped_at_6
    config = config.copy_and_resolve_references()
    config.train.update(clip=0.0, optimizer="adamw")  # another optimizer structure
    model, _, step = restore_model(config, stopped)
    trained = Trainer(stopped_at_6[0], stopped).current_model()
    assert step == 6
    for x, y in zip(
        jax.tree.leaves(nnx.state(model, nnx.Param)),
        jax.tree.leaves(nnx.state(trained, nnx.Param)),
        strict=True,
    ):
        np.testing.assert_array_equal(x, y)
