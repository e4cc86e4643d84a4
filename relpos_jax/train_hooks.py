"""The training loop's work besides the step, one concern each: on which steps it logs, validates
and checkpoints (``Schedule``), when it ends early with a checkpoint (``EarlyStop``: ``stop_after``,
SIGTERM, SIGINT), and what it does about a step with a NaN/Inf loss or gradient (``FiniteCheck``).
"""

from __future__ import annotations

import pathlib
import signal
import threading
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils  # no stable replacement yet
from tqdm import tqdm

from relpos_jax.config import TrainConfig
from relpos_jax.progress import scalar


class NonFiniteLoss(FloatingPointError):
    """A NaN/Inf loss or gradient; the message names the step, the quantity, the kept checkpoint."""


class Schedule:
    """The steps that fall on ``train.log_every``, ``eval_every``, ``ckpt_every`` (0: never)."""

    def __init__(self, cfg: TrainConfig):
        self.cfg = cfg

    def log(self, step: int) -> bool:
        return step % self.cfg.log_every == 0 or step == self.cfg.steps

    def validate(self, step: int) -> bool:
        """Not at the last step: the run's end validates the whole split there."""
        every = self.cfg.eval_every
        return bool(every) and step % every == 0 and step < self.cfg.steps

    def save(self, step: int) -> bool:
        every = self.cfg.ckpt_every
        return bool(every) and step % every == 0

    def any(self, step: int) -> bool:
        return self.log(step) or self.validate(step) or self.save(step)


class EarlyStop:
    """Why the run ends before ``train.steps``, if it does: at ``stop_after`` (as a kill would, minus
    the loss of unsaved steps), or at the step after SIGTERM / SIGINT (preemption), which it notes
    instead of dying mid-step. Restores the old signal handlers on exit."""

    def __init__(self, stop_after: int | None, *, every: int):
        self.stop_after, self.every = stop_after, every
        self.signal: str | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> EarlyStop:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._note)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _note(self, signum, frame) -> None:
        self.signal = signal.Signals(signum).name

    def reason(self, step: int) -> str | None:
        """Why to stop before ``step``'s training step, or None to go on."""
        if self.stop_after is not None and step >= self.stop_after:
            return f"stop_after={self.stop_after}"
        return self.signal if self._signalled(step) else None

    def _signalled(self, step: int) -> bool:
        """With several processes they agree, at log steps, to stop together."""
        if jax.process_count() == 1:
            return self.signal is not None
        if step % self.every:
            return False
        flags = multihost_utils.process_allgather(np.array(self.signal is not None))
        if flags.any() and self.signal is None:
            self.signal = "SIGTERM (another process)"
        return bool(flags.any())


class FiniteCheck:
    """Stops the run at a step with a NaN/Inf loss or gradient, or with ``train.skip_nonfinite``
    counts it (the step changed nothing) and stops after ``max_consecutive_skips`` in a row.

    A step is checked once the next one is queued (``queue``): by then the device is done with it,
    so reading its metrics does not stall the pipeline. ``settle`` checks the pending one at once:
    before anything logs, evaluates or saves the state it left."""

    def __init__(self, cfg: TrainConfig, checkpointer, kept_in: pathlib.Path):
        self.cfg, self.checkpointer, self.kept_in = cfg, checkpointer, kept_in
        self.in_a_row = 0  # consecutive non-finite steps, as the optimizer state counts them
        self._pending: tuple[int, dict[str, jax.Array]] | None = None

    def queue(self, step: int, metrics: dict[str, jax.Array]) -> None:
        self.settle()
        self._pending = (step, metrics)

    def settle(self) -> None:
        if self._pending is not None:
            self._check(*self._pending)
            self._pending = None

    def _check(self, step: int, metrics: dict[str, jax.Array]) -> None:
        if bool(scalar(metrics["finite"])):
            self.in_a_row = 0  # a finite step resets the optimizer's count too
            return
        self.in_a_row = int(scalar(metrics["in_a_row"]))  # from the state: it survives a resume
        self.checkpointer.wait()  # a save still being written is finished before the run ends
        loss, norm = scalar(metrics["loss"]), scalar(metrics["grad_norm"])
        quantity = f"loss is {loss}" if not np.isfinite(loss) else f"gradient norm is {norm}"
        kept = (
            f"the last good checkpoint (step {self.checkpointer.latest_step()}) is kept in "
            f"{self.kept_in}"
        )
        if not self.cfg.skip_nonfinite:
            raise NonFiniteLoss(
                f"train: the {quantity} at step {step}; the step was not applied and {kept}; "
                "lower train.lr, raise train.warmup_steps, or set train.skip_nonfinite=True "
                "to skip such steps"
            )
        tqdm.write(
            f"step {step}: the {quantity}; skipped it (parameters and optimizer unchanged, memory "
            f"reset), {int(scalar(metrics['skipped']))} skipped in all"
        )
        if self.in_a_row >= self.cfg.max_consecutive_skips:
            raise NonFiniteLoss(
                f"train: the {quantity} at step {step}, non-finite for {self.in_a_row} "
                f"steps in a row (train.max_consecutive_skips); {kept}; lower train.lr or raise "
                "train.warmup_steps"
            )
