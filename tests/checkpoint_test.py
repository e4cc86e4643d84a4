"""Checkpoints: a run killed anywhere resumes with the same losses; a corrupt newest checkpoint
falls back to the one before; one of another config is refused in one line (also on the command
line: exit code 2); evaluation restores past both.

The yardstick is always the run that was never interrupted: a run killed (SIGKILL) at any point and
started again with the same command must log the same losses, step for step, bitwise.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys

import jax
import numpy as np
import pytest
from flax import nnx

from relpos_jax import checkpoint
from relpos_jax.checkpoint import CheckpointError, latest_step
from relpos_jax.config import ConfigError
from relpos_jax.evaluate import restore_model
from relpos_jax.metrics import read_metrics
from relpos_jax.train import Trainer
from tests.helpers import ROOT, files_under, kill_when_logged, logged_losses, run_cli, tiny_flags

# ----------------------------------------------------------------------------- kills (SIGKILL)


@pytest.mark.slow
def test_sigkill_anywhere_then_the_same_command_logs_the_same_losses(tiny, tmp_path):
    config, _ = tiny
    steps = 16

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

    # SIGKILL while steps and (asynchronous) checkpoint writes are under way ...
    code = kill_when_logged([sys.executable, "train.py", *flags(killed)], killed, 6)
    assert code == -signal.SIGKILL
    # ... and once at the worst moment of a save: its files written, the commit (rename) not done.
    before = latest_step(killed / "checkpoints")
    commit = subprocess.run(
        [sys.executable, "tests/kill_during_save.py", str(before + 1), *flags(killed)],
        cwd=ROOT,
        capture_output=True,
        timeout=300,
        env={**os.environ, "JAX_COMPILATION_CACHE_DIR": str(tmp_path / "killed_jax_cache")},
    )
    assert commit.returncode == -signal.SIGKILL
    assert latest_step(killed / "checkpoints") == before  # the half-saved one is not a checkpoint
    assert any(".orbax-checkpoint-tmp" in p.name for p in (killed / "checkpoints").iterdir())

    resumed = run_cli("train.py", *flags(killed))
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert f"resuming from step {before}" in resumed.stdout
    # Every loss any of the three processes logged (steps redone after a kill included) is the
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


def _garble(step_dir):
    for path in files_under(step_dir / "state"):
        if "/d/" in str(path):  # array data chunks
            path.write_bytes(np.random.default_rng(0).bytes(path.stat().st_size))


def _truncate(step_dir):
    for path in files_under(step_dir / "state"):
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
    before = files_under(stopped)
    with pytest.raises(ConfigError) as error:
        Trainer(config, stopped)
    assert names in str(error.value) and "\n" not in str(error.value), str(error.value)
    assert files_under(stopped) == before


@pytest.mark.slow
def test_cli_resume_with_another_d_model_exits_2_in_one_line(stopped_at_6, tmp_path):
    config, stopped, _ = stopped_at_6
    shutil.copytree(stopped, tmp_path / "run")
    flags = tiny_flags(config, tmp_path / "run")
    result = run_cli("train.py", *flags, "--config.model.d_model=64", "--config.model.n_heads=2")
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and len(errors) == 1, result.stderr[-2000:]
    assert "model.d_model=64 is invalid" in errors[0] and "Traceback" not in result.stderr


# ----------------------------------------------------------------------------- evaluation


@pytest.mark.slow
def test_evaluation_skips_a_corrupt_newest_checkpoint_and_moves_nothing(stopped_at_6, tmp_path):
    config, stopped, _ = stopped_at_6
    workdir = tmp_path / "run"
    shutil.copytree(stopped, workdir)
    _truncate(workdir / "checkpoints" / "6")
    before = files_under(workdir)
    _, _, step = restore_model(config, workdir)
    assert step == 4 and files_under(workdir) == before


@pytest.mark.slow
def test_evaluation_restores_only_the_model_whatever_the_optimizer(stopped_at_6):
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


def test_pystdlib_checkpoints_from_before_partitions_resume_only_with_the_hash_partition():
    saved_value = checkpoint._saved_value
    older = {"data": {"name": "pystdlib"}}  # written before data.partition existed
    assert saved_value(older, "data", "partition", "dedup") == "hash"
    newer = {"data": {"name": "pystdlib", "partition": "dedup"}}
    assert saved_value(newer, "data", "partition", "dedup") == "dedup"
    other_corpus = {"data": {"name": "text", "partition": "hash"}}  # means nothing there
    assert saved_value(other_corpus, "data", "partition", "dedup") == "dedup"
    assert saved_value(older, "model", "d_model", 64) == 64  # a field it did not record


def test_a_pystdlib_checkpoint_records_whose_standard_library_it_was_trained_on(monkeypatch):
    from relpos_jax.config import Config, load_config
    from relpos_jax.data import corpora

    monkeypatch.setattr(corpora, "running_python", lambda: "3.12")
    unset = Config.from_any(load_config(ROOT / "configs/txl_small.py"))
    assert checkpoint.sections(unset)["data"]["python"] == "3.12"  # resolved: this Python's
    pinned = Config.from_any(load_config(ROOT / "configs/txl_small.py", ["data.python=3.11"]))
    assert checkpoint.sections(pinned)["data"]["python"] == "3.11"
    text = Config.from_any(load_config(ROOT / "configs/txl_small.py", ["data.name=text"]))
    assert checkpoint.sections(text)["data"]["python"] is None  # means nothing there
    saved = {"data": {"name": "pystdlib", "partition": "dedup", "python": "3.11"}}
    assert checkpoint._saved_value(saved, "data", "python", "3.12") == "3.11"  # refused: differs
    older = {"data": {"name": "pystdlib", "partition": "dedup"}}  # before the field: any matches
    assert checkpoint._saved_value(older, "data", "python", "3.12") == "3.12"


def test_checkpoints_from_before_scheme_settings_are_read_under_their_flat_names():
    saved_value = checkpoint._saved_value
    older = {"model": {"shaw_max_distance": 3, "untie_r": True}}  # before model.<scheme>.<field>
    assert saved_value(older, "model", "shaw.max_distance", 64) == 3
    assert saved_value(older, "model", "txl.untie_r", False) is True
    assert saved_value({"model": {"shaw.max_distance": 5}}, "model", "shaw.max_distance", 64) == 5
    assert saved_value({"model": {}}, "model", "t5.num_buckets", 32) == 32  # not recorded


# ----------------------------------------------------------------------------- fine-tuning


@pytest.mark.slow
def test_init_from_starts_a_run_from_another_runs_model_with_a_fresh_optimizer(
    stopped_at_6, tmp_path
):
    config, stopped, _ = stopped_at_6
    config = config.copy_and_resolve_references()
    config.train.update(init_from=str(stopped), steps=2, ckpt_every=0)
    config.data.segment_len = 16  # a fine-tune at a longer length
    trainer = Trainer(config, tmp_path / "finetune")
    assert trainer.step == 0 and trainer.resumed_from is None
    model, optimizer = nnx.merge(trainer.graphdef, trainer.state)
    saved, _, step = restore_model(config, stopped)
    assert step == 6
    for got, want in zip(
        jax.tree.leaves(nnx.state(model, nnx.Param)),
        jax.tree.leaves(nnx.state(saved, nnx.Param)),
        strict=True,
    ):
        np.testing.assert_array_equal(np.asarray(got), np.asarray(want))
    assert int(optimizer.step[...]) == 0
    trainer.run()
    assert [s for s, _ in logged_losses(tmp_path / "finetune")] == [1, 2]
    resumed = Trainer(config, tmp_path / "finetune")  # its own checkpoint wins over init_from
    assert resumed.resumed_from == 2


@pytest.mark.slow
@pytest.mark.parametrize(
    ("field", "value", "names"),
    [
        ("init_from", "nowhere", "train.init_from='nowhere' is invalid; it holds no checkpoint"),
        ("d_model", 64, "model.d_model=64 is invalid; the checkpoint at step 6"),
    ],
)
def test_init_from_what_cannot_start_the_run_is_one_line(
    stopped_at_6, tmp_path, field, value, names
):
    config, stopped, _ = stopped_at_6
    config = config.copy_and_resolve_references()
    config.train.init_from = str(stopped)
    section = "train" if field == "init_from" else "model"
    config[section][field] = str(tmp_path / value) if field == "init_from" else value
    with pytest.raises(ConfigError) as error:
        Trainer(config, tmp_path / "finetune")
    message = str(error.value).replace(str(tmp_path / "nowhere"), "nowhere")
    assert names in message and "\n" not in message, message
