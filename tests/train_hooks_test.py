"""The training loop's pieces besides the step (``relpos_jax.train_hooks``), without a model: which
steps log, validate and checkpoint; when a run stops early; what a NaN/Inf step does."""

from __future__ import annotations

import os
import pathlib
import signal

import jax.numpy as jnp
import pytest

from relpos_jax.config import Config
from relpos_jax.train_hooks import EarlyStop, FiniteCheck, NonFiniteLoss, Schedule


def _train(tiny, **fields):
    config = tiny[0].copy_and_resolve_references()
    config.train.update(fields)
    return Config.from_any(config).train


def test_schedule_names_the_steps_of_each_periodic_piece(tiny):
    when = Schedule(_train(tiny, steps=30, log_every=10, eval_every=15, ckpt_every=0))
    steps = range(1, 31)
    assert [s for s in steps if when.log(s)] == [10, 20, 30]
    assert [s for s in steps if when.validate(s)] == [15]  # step 30: the end validates all
    assert not any(when.save(s) for s in steps)  # 0: never
    assert [s for s in steps if when.any(s)] == [10, 15, 20, 30]
    last = Schedule(_train(tiny, steps=7, log_every=5, eval_every=0, ckpt_every=3))
    assert [s for s in range(1, 8) if last.log(s)] == [5, 7]  # and the last step
    assert [s for s in range(1, 8) if last.save(s)] == [3, 6]


def test_early_stop_at_stop_after_and_at_the_step_after_a_signal():
    with EarlyStop(3, every=10) as early:
        assert early.reason(2) is None and early.reason(3) == "stop_after=3"
    previous = signal.getsignal(signal.SIGTERM)
    with EarlyStop(None, every=10) as early:
        assert early.reason(5) is None
        os.kill(os.getpid(), signal.SIGTERM)  # noted, not fatal
        assert early.reason(6) == "SIGTERM"
    assert signal.getsignal(signal.SIGTERM) is previous


class _Checkpointer:
    def __init__(self, latest):
        self.latest, self.waited = latest, 0

    def latest_step(self):
        return self.latest

    def wait(self):
        self.waited += 1


def _metrics(loss, *, skipped=0, in_a_row=None):
    finite = bool(jnp.isfinite(loss))
    return {
        "loss": jnp.float32(loss),
        "grad_norm": jnp.float32(1.0),
        "finite": jnp.bool_(finite),
        "skipped": jnp.int32(skipped),
        "in_a_row": jnp.int32(in_a_row if in_a_row is not None else (0 if finite else 1)),
    }


def test_a_nonfinite_step_raises_once_the_next_is_queued_or_at_settle(tiny):
    kept = pathlib.Path("w/checkpoints")
    check = FiniteCheck(_train(tiny), _Checkpointer(4), kept)
    check.queue(5, _metrics(float("nan")))  # pending: nothing read yet
    with pytest.raises(NonFiniteLoss, match=r"loss is nan at step 5; .*\(step 4\) is kept in w/"):
        check.queue(6, _metrics(1.0))
    check = FiniteCheck(_train(tiny), _Checkpointer(4), kept)
    check.queue(5, _metrics(float("inf")))
    with pytest.raises(NonFiniteLoss, match="loss is inf at step 5"):
        check.settle()


def test_skip_nonfinite_counts_in_a_row_and_stops_at_the_limit(tiny, capsys):
    cfg = _train(tiny, skip_nonfinite=True, max_consecutive_skips=2)
    checkpointer = _Checkpointer(2)
    check = FiniteCheck(cfg, checkpointer, pathlib.Path("w"))
    check.queue(3, _metrics(float("nan"), skipped=1))
    check.queue(4, _metrics(1.0, skipped=1))  # step 3 skipped
    check.queue(5, _metrics(float("nan"), skipped=2))  # a finite step 4 ended the streak
    check.settle()
    assert check.in_a_row == 1 and checkpointer.waited == 2
    assert "step 5: the loss is nan; skipped it" in capsys.readouterr().out
    check.queue(6, _metrics(float("nan"), skipped=3, in_a_row=2))
    with pytest.raises(NonFiniteLoss, match="at step 6, non-finite for 2 steps in a row"):
        check.settle()
    check = FiniteCheck(cfg, checkpointer, pathlib.Path("w"))  # a resumed run: the state's count
    check.queue(7, _metrics(float("nan"), skipped=4, in_a_row=2))
    with pytest.raises(NonFiniteLoss, match="at step 7, non-finite for 2 steps in a row"):
        check.settle()
