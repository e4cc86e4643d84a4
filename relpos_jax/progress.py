"""What a training run reports as it goes: a progress bar on a terminal (or, in a log file, one
plain line a log step), ``metrics.jsonl`` and TensorBoard (``MetricsWriter``), and the tokens a
second over the steps since the last report (the first, compiling step left out). A context
manager: the bar and the files close however the run ends."""

from __future__ import annotations

import pathlib
import sys
import time
from typing import Any

import jax
import numpy as np
from tqdm import tqdm

from relpos_jax.metrics import BITS_PER_NAT, MetricsWriter, read_metrics


def scalar(x: jax.Array) -> float:
    """A replicated scalar as a float, also when the array spans several processes."""
    return float(np.asarray(x.addressable_data(0)))


def last_logged(workdir: pathlib.Path, key: str) -> float | None:
    """The last value of ``key`` in metrics.jsonl (a resumed run that had no step left to do)."""
    values = [m[key] for m in read_metrics(workdir) if key in m]
    return values[-1] if values else None


class Progress:
    """The bar, the metrics files and the throughput window of one run (main process: ``enabled``)."""

    def __init__(self, workdir: pathlib.Path, *, steps: int, initial: int, tokens_per_step: int,
                 enabled: bool):  # fmt: skip
        self.writer = MetricsWriter(workdir, enabled=enabled)
        self.steps, self.tokens_per_step, self.enabled = steps, tokens_per_step, enabled
        # a terminal gets a redrawn bar; a log file one plain line a log step, not a redraw a step
        self.interactive = sys.stderr.isatty()
        self.bar = tqdm(total=steps, initial=initial, disable=not enabled or not self.interactive,
                        unit="step", dynamic_ncols=True, desc="train")  # fmt: skip
        self.last: dict[str, float] = {}  # the newest training metrics logged
        self.compiled = False  # whether this run's first step (its compile) is behind it
        self.restart()
        self.started = time.perf_counter()

    def __enter__(self) -> Progress:
        return self

    def __exit__(self, *exc) -> None:
        self.bar.close()
        self.writer.close()

    def seconds(self) -> float:
        """Since the run started, its compile included."""
        return time.perf_counter() - self.started

    def restart(self) -> None:
        """Measure throughput from here (after a compile, a log line or a validation)."""
        self.window_start, self.window_steps = time.perf_counter(), 0

    def stepped(self, metrics: dict[str, jax.Array]) -> None:
        """One step more; the first of a run compiled, so throughput is measured from its end."""
        self.window_steps += 1
        self.bar.update(1)
        if not self.compiled:
            jax.block_until_ready(metrics["loss"])
            self.compiled = True
            self.restart()

    def log(self, step: int, metrics: dict[str, jax.Array]) -> None:
        loss, grad_norm = scalar(metrics["loss"]), scalar(metrics["grad_norm"])
        skipped = int(scalar(metrics["skipped"]))
        elapsed = time.perf_counter() - self.window_start
        self.last = {
            "train/loss": loss,
            "train/bpc": loss * BITS_PER_NAT,
            "train/grad_norm": grad_norm,
            "train/skipped_steps": skipped,
            "tokens_per_sec": self.window_steps * self.tokens_per_step / elapsed,
        }
        self.writer.write(step, self.last)
        bpc, speed = self.last["train/bpc"], self.last["tokens_per_sec"]
        self.bar.set_postfix(loss=f"{loss:.3f}", bpc=f"{bpc:.3f}", tok_s=f"{speed:,.0f}")
        if self.enabled and not self.interactive:
            print(f"step {step}/{self.steps}: loss {loss:.3f}, bpc {bpc:.3f}, {speed:,.0f} tokens/s",
                  flush=True)  # fmt: skip
        self.restart()

    def validated(self, step: int, valid: dict[str, Any], *, say: bool = True) -> None:
        self.writer.write(
            step,
            {"valid/bpc": valid["bpc"], "valid/ppl": valid["ppl"], "valid/loss": valid["loss"]},
        )
        if say:
            self.bar.write(
                f"step {step}: valid bpc {valid['bpc']:.4f}, ppl {valid['ppl']:.2f} "
                f"({valid['tokens']:,} tokens)"
            )
        self.restart()
