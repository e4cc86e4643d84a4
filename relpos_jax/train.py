"""The training loop around one jitted step (``train_step``), the memory carried from step to step.

Each step takes the next ``[B, T]`` segment of every row's stream, so the memory the model carries
(``Memory``, explicit state) holds the text right before it. Orbax checkpoints (parameters,
optimizer, memory, data iterator, step) every ``ckpt_every`` steps; a work directory that holds one
resumes from it. Metrics go to ``metrics.jsonl`` and TensorBoard (``progress``). ``Trainer._run``
is the loop: the step, then the work that falls on it, each piece in ``train_hooks`` (``Schedule``,
``EarlyStop``, ``FiniteCheck``) or a method here.
"""

from __future__ import annotations

import contextlib
import functools
import pathlib
from typing import Any

import jax
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
from relpos_jax.progress import Progress, last_logged, scalar
from relpos_jax.train_hooks import EarlyStop, FiniteCheck, NonFiniteLoss, Schedule
from relpos_jax.train_step import jitted_train_step

__all__ = ["NonFiniteLoss", "Trainer"]


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
            self.graphdef, cfg.train.grad_accum, (treedef, tuple(leaves)), self.mesh,
            cfg.train.loss_from,
        )  # fmt: skip
        self.step = 0
        self.checkpointer = Checkpointer(
            self.workdir / "checkpoints", keep=cfg.train.keep_checkpoints
        )
        self.resumed_from = self._restore()
        self.stopped_by: str | None = None
        self.finite = FiniteCheck(cfg.train, self.checkpointer, self.workdir / "checkpoints")

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
        return int(scalar(optimizer.opt_state.total_notfinite[...]))

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
        early = EarlyStop(stop_after, every=self.config.train.log_every)
        with early, self.device_failures(), self._progress() as progress:
            return self._run(early, progress)

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

    def _progress(self) -> Progress:
        tokens_per_step = self.config.data.batch_size * self.config.data.segment_len
        return Progress(self.workdir, steps=self.config.train.steps, initial=self.step,
                        tokens_per_step=tokens_per_step, enabled=self.is_main)  # fmt: skip

    def _run(self, early: EarlyStop, progress: Progress) -> dict[str, Any] | None:
        cfg = self.config.train
        when = Schedule(cfg)
        while self.step < cfg.steps:
            if reason := early.reason(self.step):
                return self._stop(progress, reason)
            metrics = self._step()
            progress.stepped(metrics)
            if when.any(self.step):
                self.finite.settle()  # nothing logs, validates or saves a non-finite step's state
            if when.log(self.step):
                progress.log(self.step, metrics)
            if when.validate(self.step):
                progress.validated(self.step, self.validate(cfg.eval_tokens))
            if when.save(self.step):
                self.save()
        return self._finish(progress)

    def _step(self) -> dict[str, jax.Array]:
        """One training step, queued on the device; the previous one is checked for NaN/Inf now,
        done by then, as this one needed its state."""
        batch = sharding.global_batch(next(self.iterator), self.mesh)
        self.state, self.mems, metrics = self._train_step(self.state, batch, self.mems)
        self.step += 1
        self.finite.queue(self.step, metrics)
        return metrics

    def _stop(self, progress: Progress, reason: str) -> None:
        """End early with a checkpoint (``stop_after``, SIGTERM or SIGINT): the same command
        resumes here."""
        self.finite.settle()
        progress.bar.close()
        self.save()
        self.checkpointer.wait()
        self.stopped_by = reason

    def _finish(self, progress: Progress) -> dict[str, Any]:
        """The last checkpoint and the validation of the whole split: the run's summary."""
        self.finite.settle()
        progress.bar.close()
        if self.checkpointer.latest_step() != self.step:
            self.save()
        self.checkpointer.wait()
        valid = self.validate(None)
        progress.validated(self.step, valid, say=False)
        summary = self._summary(progress, valid)
        self.checkpointer.close()
        return summary

    def _summary(self, progress: Progress, valid: dict[str, Any]) -> dict[str, Any]:
        params = jax.tree.leaves(nnx.state(self.current_model(), nnx.Param))
        return {
            "step": self.step,
            "valid_bpc": valid["bpc"],
            "valid_ppl": valid["ppl"],
            "valid_tokens": valid["tokens"],
            "train_bpc": progress.last.get("train/bpc", last_logged(self.workdir, "train/bpc")),
            "seconds": progress.seconds(),
            "skipped_steps": self.skipped_steps(),
            "parameters": sum(x.size for x in params),
        }
