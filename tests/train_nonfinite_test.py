"""A NaN or Inf loss or gradient (``relpos_jax.train``): the run stops and keeps the last good
checkpoint, or with ``train.skip_nonfinite`` skips the step (changing nothing) and goes on, up to
``train.max_consecutive_skips`` in a row. The faults are injected by wrapping the training loss."""

from __future__ import annotations

import pathlib

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from relpos_jax import train_step
from relpos_jax.checkpoint import latest_step
from relpos_jax.metrics import read_metrics
from relpos_jax.train import NonFiniteLoss, Trainer


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


_REAL_LOSS = train_step.segment_loss


def _nan_loss_at_marks(model, inputs, targets, mems, loss_from=0):
    loss, new_mems = _REAL_LOSS(model, inputs, targets, mems, loss_from)
    return jnp.where(jnp.any(inputs == ord("~")), jnp.nan, loss), new_mems


def _nan_gradient_at_marks(model, inputs, targets, mems, loss_from=0):
    """Finite loss, NaN gradient: d sqrt(x)/dx at 0 is inf, times a zero derivative."""
    loss, new_mems = _REAL_LOSS(model, inputs, targets, mems, loss_from)
    zero = jnp.where(jnp.any(inputs == ord("~")), 0.0, 1.0) * (1.0 + 0.0 * loss)
    return loss + jnp.sqrt(zero) - jnp.sqrt(jax.lax.stop_gradient(zero)), new_mems


@pytest.fixture(autouse=True)
def _fresh_train_steps():
    """The jitted training steps a process caches were traced with the real loss: none is reused
    here, and none traced with a fault outlives its test."""
    train_step.jitted_train_step.cache_clear()
    yield
    train_step.jitted_train_step.cache_clear()


def _inject(monkeypatch, fault):
    """Train with ``fault`` as the loss."""
    monkeypatch.setattr(train_step, "segment_loss", fault)


@pytest.mark.slow
@pytest.mark.parametrize(
    ("fault", "quantity"),
    [(_nan_loss_at_marks, "loss is nan"), (_nan_gradient_at_marks, "gradient norm is nan")],
)
def test_nonfinite_step_stops_the_run_and_keeps_the_last_good_checkpoint(
    tiny, tmp_path, monkeypatch, fault, quantity
):
    config = _marked_corpus(tiny[0], tmp_path, steps=(5,))
    _inject(monkeypatch, fault)
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
    _inject(monkeypatch, _nan_loss_at_marks)
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
    _inject(monkeypatch, _nan_loss_at_marks)
    with pytest.raises(NonFiniteLoss, match="at step 5, non-finite for 3 steps in a row"):
        Trainer(config, tmp_path / "run").run()
    assert latest_step(tmp_path / "run" / "checkpoints") == 4  # skipped steps 3, 4: still good
    # stopped and resumed within the streak: the count goes on from the saved optimizer state
    Trainer(config, tmp_path / "resumed").run(stop_after=4)  # saves step 4, two in a row
    with pytest.raises(NonFiniteLoss, match="at step 5, non-finite for 3 steps in a row"):
        Trainer(config, tmp_path / "resumed").run()
