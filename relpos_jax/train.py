"""The training loop around one jitted step (``train_step``), the memory carried from step to step.

Each step takes the next ``[B, T]`` segment of every row's stream, so the memory the model carries
(``Memory``, explicit state) holds the text right before it. Orbax checkpoints (parameters,
optimizer, memory, data iterator, step) every ``ckpt_every`` steps; a work directory that holds one
resumes from it. Metrics go to ``metrics.jsonl`` and TensorBoard.
"""

from __future__ import annotations

import contextlib
import functools
import pathlib
import signal
import threading
import time
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.experimental import multihost_utils  # no stable replacement yet

from relpos_jax import data as data_lib
from relpos_jax import sharding, train_step
from relpos_jax.checkpoint import Checkpointer, restore_run_model, sections
from relpos_jax.config import Config
from relpos_jax.errors import accelerator_error
from relpos_jax.evaluate import EvalSettings, evaluate_split
from relpos_jax.memory import init_mems
from relpos_jax.model import TransformerLM
from relpos_jax.progress import Progress, last_logged
from relpos_jax.train_step import jitted_train_step


def _scalar(x: jax.Array) -> float:
    """A replicated scalar as a float, also when the array spans several processes."""
    return float(np.asarray(x.addressable_data(0)))


class NonFiniteLoss(FloatingPointError):
    """A NaN/Inf loss or gradient; the message names the step, the quantity, the kept checkpoint."""


class _StopSignals:
    """Notes SIGTERM / SIGINT instead of dying mid-step; restores the old handlers on exit."""

    def __init__(self):
        self.name: str | None = None
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _StopSignals:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGTERM, signal.SIGINT):
                self._previous[sig] = signal.signal(sig, self._note)
        return self

    def __exit__(self, *exc) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _note(self, signum, frame) -> None:
        self.name = signal.Signals(signum).name

    def received(self, *, every: int, step: int) -> bool:
        """Whether to stop now. With several processes they agree, at log steps, to stop together."""
        if jax.process_count() == 1:
            return self.name is not None
        if step % every:
            return False
        flags = multihost_utils.process_allgather(np.array(self.name is not None))
        if flags.any() and self.name is None:
            self.name = "SIGTERM (another process)"
        return bool(flags.any())


class Trainer:
    """Holds a run's model, optimizer, data and checkpoints; ``run()`` trains to ``train.steps``."""

    def __init__(self, config: Any, workdir: str | pathlib.Path, devices=None):
        self.config = Config.from_any(config)
        self.workdir = pathlib.Path(workdir)
        self.is_main = jax.process_index() == 0
        cfg = self.config
        self.mesh = sharding.make_mesh(cfg.mesh, devices)
        sharding.check_batch(cfg.data.batch_size, self.mesh, jax.process_count())
        sharding.check_context(
            self.mesh, cfg.model.attention_impl, segment_len=cfg.data.segment_len,
            mem_len=cfg.model.mem_len,
        )  # fmt: skip
        self.mems_sharding = sharding.memory_sharding(self.mesh)
        if jax.process_count() > 1:  # one process builds the dataset, the others then read it
            if self.is_main:
                data_lib.open_data(cfg.data, "train")
            multihost_utils.sync_global_devices("relpos_jax: dataset built")
        self.stream = data_lib.open_data(cfg.data, "train")
        data_lib.check_vocab_size(self.stream, cfg.model.vocab_size)
        dataset = data_lib.train_dataset(
            self.stream,
            cfg.data.batch_size,
            cfg.data.segment_len,
            process_index=jax.process_index(),
            process_count=jax.process_count(),
        )
        self.iterator = iter(dataset.to_iter_dataset())
        with self.device_failures():
            self.graphdef, self.state = self._sharded_state()
        m = cfg.model
        self.mems = jax.jit(
            lambda: init_mems(m.n_layers, cfg.data.batch_size, m.mem_len, m.d_model, m.dtype),
            out_shardings=self.mems_sharding,
        )()
        leaves, treedef = jax.tree.flatten(self.state_sharding)
        self._train_step = jitted_train_step(
            self.graphdef, cfg.train.grad_accum, (treedef, tuple(leaves)), self.mesh
        )
        self.step = 0
        self.checkpointer = Checkpointer(
            self.workdir / "checkpoints", keep=cfg.train.keep_checkpoints
        )
        self.resumed_from = self._restore()
        self.stopped_by: str | None = None
        self._bad_in_a_row = 0  # consecutive non-finite steps (train.skip_nonfinite)
        # (step, metrics) of the newest step: checked for finiteness once the next is queued
        self._unchecked = None

    def _sharded_state(self):
        """Abstract shapes first, then a jitted init whose outputs are born sharded."""
        build = functools.partial(train_step.build, self.config)
        graphdef, abstract = nnx.split(nnx.eval_shape(build))
        self.state_sharding = sharding.state_shardings(abstract, self.mesh)
        state = jax.jit(lambda: nnx.split(build())[1], out_shardings=self.state_sharding)()
        return graphdef, state

    def _restore(self) -> int | None:
        found = self.checkpointer.restore_newest(
            lambda step: self.checkpointer.restore(step, state=self.state, mems=self.mems),
            state=self.state,
            config=self.config,
            set_aside=True,
        )
        if found is None:
            if self.config.train.init_from:
                self._start_from(self.config.train.init_from)
            return None
        _, restored = found
        self.state, self.mems = restored["state"], restored["mems"]
        self.iterator.set_state(restored["data"])
        self.step = int(restored["meta"]["step"])
        return self.step

    def _start_from(self, workdir: str) -> None:
        """The model of ``workdir``'s newest checkpoint in place of the fresh one (``train.init_from``):
        the model fields must match it, the optimizer, data and step start anew."""
        step, self.state[0] = restore_run_model(
            workdir, self.state[0], self.config, field="train.init_from",
            fix="pass the --workdir of a trained run",
        )  # fmt: skip
        if self.is_main:
            print(f"starting from the model of {workdir} (step {step})", flush=True)

    def save(self) -> None:
        self.checkpointer.save(
            self.step,
            state=self.state,
            mems=self.mems,
            data=self.iterator.get_state(),
            meta={"step": self.step, "config": sections(self.config)},
        )

    def skipped_steps(self) -> int:
        """Steps whose loss or gradient was NaN/Inf and that changed nothing (all runs)."""
        _, optimizer = nnx.merge(self.graphdef, self.state)
        return int(_scalar(optimizer.opt_state.total_notfinite[...]))

    def _check_finite(self, step: int, metrics: dict[str, jax.Array], bar) -> None:
        """Stop (or, with train.skip_nonfinite, count) a step with a NaN/Inf loss or gradient."""
        if bool(_scalar(metrics["finite"])):
            self._bad_in_a_row = 0
            return
        cfg = self.config.train
        self.checkpointer.wait()  # a save still being written is finished before the run ends
        loss, norm = _scalar(metrics["loss"]), _scalar(metrics["grad_norm"])
        quantity = f"loss is {loss}" if not np.isfinite(loss) else f"gradient norm is {norm}"
        kept = (
            f"the last good checkpoint (step {self.checkpointer.latest_step()}) is kept in "
            f"{self.workdir / 'checkpoints'}"
        )
        if not cfg.skip_nonfinite:
            bar.close()
            raise NonFiniteLoss(
                f"train: the {quantity} at step {step}; the step was not applied and {kept}; "
                "lower train.lr, raise train.warmup_steps, or set train.skip_nonfinite=True "
                "to skip such steps"
            )
        self._bad_in_a_row += 1
        bar.write(
            f"step {step}: the {quantity}; skipped it (parameters and optimizer unchanged, memory "
            f"reset), {int(_scalar(metrics['skipped']))} skipped in all"
        )
        if self._bad_in_a_row >= cfg.max_consecutive_skips:
            bar.close()
            raise NonFiniteLoss(
                f"train: the {quantity} at step {step}, non-finite for {self._bad_in_a_row} "
                f"steps in a row (train.max_consecutive_skips); {kept}; lower train.lr or raise "
                "train.warmup_steps"
            )

    def current_model(self) -> TransformerLM:
        model, _ = nnx.merge(self.graphdef, self.state)
        return model

    def validate(self, max_tokens: int | None) -> dict[str, Any]:
        return evaluate_split(
            self.current_model(),
            self.config,
            "valid",
            settings=EvalSettings.of_training(self.config),
            max_tokens=max_tokens or None,
            mesh=self.mesh,
        )

    def run(self, stop_after: int | None = None) -> dict[str, Any] | None:
        """Train to ``train.steps`` and return a summary.

        Ends early with a checkpoint and returns None at ``stop_after`` (as a kill would, minus the
        loss of unsaved steps) or after SIGTERM / SIGINT (preemption): the signal is noted and the run
        stops at the next step boundary, so the same command resumes exactly where it stopped.
        """
        with _StopSignals() as signals, self.device_failures():
            return self._run(stop_after, signals)

    @contextlib.contextmanager
    def device_failures(self):
        """A device's refusal of a known kind (memory, shared memory, VMEM, a kernel that does not
        compile) as ``errors.AcceleratorError``: one line naming the field to change."""
        try:
            yield
        except jax.errors.JaxRuntimeError as error:
            explained = accelerator_error(error, self.config)
            if explained is None:
                raise
            raise explained from error

    def _run(self, stop_after: int | None, signals: _StopSignals) -> dict[str, Any] | None:
        cfg = self.config.train
        tokens_per_step = self.config.data.batch_size * self.config.data.segment_len
        progress = Progress(self.workdir, steps=cfg.steps, initial=self.step,
                            tokens_per_step=tokens_per_step, enabled=self.is_main)  # fmt: skip
        run_start, first_step = time.perf_counter(), self.step
        while self.step < cfg.steps:
            if stop_after is not None and self.step >= stop_after:
                return self._stop(progress, f"stop_after={stop_after}")
            if signals.received(every=cfg.log_every, step=self.step):
                return self._stop(progress, signals.name)
            metrics = self._step(progress.bar)
            progress.stepped()
            if self.step == first_step + 1:  # the first step compiled: time from here on
                jax.block_until_ready(metrics["loss"])
                progress.restart()
            self._periodic(progress, metrics)
        return self._finish(progress, run_start)

    def _step(self, bar) -> dict[str, jax.Array]:
        """One training step; the previous one's finiteness checked once this one is queued."""
        batch = sharding.global_batch(next(self.iterator), self.mesh)
        self.state, self.mems, metrics = self._train_step(self.state, batch, self.mems)
        self.step += 1
        self._settle(bar)  # the previous step: done by now, as the new one needed its state
        self._unchecked = (self.step, metrics)
        return metrics

    def _settle(self, bar) -> None:
        """Check the newest step's finiteness: before any checkpoint, evaluation or log."""
        if self._unchecked is not None:
            self._check_finite(*self._unchecked, bar)
            self._unchecked = None

    def _periodic(self, progress: Progress, metrics: dict[str, jax.Array]) -> None:
        """The log line, the validation and the checkpoint that fall on this step."""
        cfg = self.config.train
        log_now = self.step % cfg.log_every == 0 or self.step == cfg.steps
        eval_now = cfg.eval_every and self.step % cfg.eval_every == 0 and self.step < cfg.steps
        save_now = cfg.ckpt_every and self.step % cfg.ckpt_every == 0
        if log_now or eval_now or save_now:
            self._settle(progress.bar)
        if log_now:
            progress.log(self.step, _scalar(metrics["loss"]), _scalar(metrics["grad_norm"]),
                         int(_scalar(metrics["skipped"])))  # fmt: skip
        if eval_now:
            progress.validated(self.step, self.validate(cfg.eval_tokens))
        if save_now:
            self.save()

    def _stop(self, progress: Progress, reason: str) -> None:
        """End early with a checkpoint (``stop_after``, SIGTERM or SIGINT): the same command
        resumes here."""
        self._settle(progress.bar)
        progress.bar.close()
        self.save()
        self.checkpointer.wait()
        progress.writer.close()
        self.stopped_by = reason

    def _finish(self, progress: Progress, run_start: float) -> dict[str, Any]:
        """The last checkpoint and the validation of the whole split: the run's summary."""
        self._settle(progress.bar)
        progress.bar.close()
        if self.checkpointer.latest_step() != self.step:
            self.save()
        self.checkpointer.wait()
        valid = self.validate(None)
        progress.validated(self.step, valid, say=False)
        progress.writer.close()
        summary = {
            "step": self.step,
            "valid_bpc": valid["bpc"],
            "valid_ppl": valid["ppl"],
            "valid_tokens": valid["tokens"],
            "train_bpc": progress.last.get("train/bpc", last_logged(self.workdir, "train/bpc")),
            "seconds": time.perf_counter() - run_start,
            "skipped_steps": self.skipped_steps(),
            "parameters": sum(
                x.size for x in jax.tree.leaves(nnx.state(self.current_model(), nnx.Param))
            ),
        }
        self.checkpointer.close()
        return summary
