"""Small builders the tests share."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

from flax import nnx

from relpos_jax import TransformerLM
from relpos_jax.metrics import read_metrics

ROOT = pathlib.Path(__file__).resolve().parent.parent


def tiny_model(position: str, seed: int = 0, **overrides) -> TransformerLM:
    """A 2-layer model small enough for loops, with tables sized so that short tests reach their
    clamped and log-bucketed rows; ``init_std`` large enough that positions change the logits."""
    config = dict(
        position=position,
        n_layers=2,
        d_model=32,
        n_heads=4,
        d_ff=64,
        mem_len=5,
        dropout=0.0,
        init_std=0.3,
        shaw_max_distance=3,
        t5_num_buckets=8,
        t5_max_distance=12,
        deberta_bucket_size=4,
        deberta_max_position=16,
        max_len=64,
    )
    config.update(overrides)
    return TransformerLM(config, rngs=nnx.Rngs(seed))


def files_under(folder: pathlib.Path) -> list[pathlib.Path]:
    """Every file below ``folder``, sorted."""
    return sorted(p for p in folder.rglob("*") if p.is_file())


def logged_losses(workdir):
    return [(m["step"], m["train/loss"]) for m in read_metrics(workdir) if "train/loss" in m]


def run_cli(*args, **env):
    """``python *args`` in the project root; ``env`` adds environment variables."""
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, cwd=ROOT, timeout=300,
        env={**os.environ, **env},
    )  # fmt: skip


def tiny_flags(config, workdir) -> list[str]:
    """Command-line flags for txl_small shrunk to the tiny corpus and model, in ``workdir``."""
    return [
        "--config", "configs/txl_small.py", "--workdir", str(workdir),
        "--config.data.name=text",
        f"--config.data.path={config.data.path}",
        f"--config.data.dir={config.data.dir}",
        "--config.model.n_layers=1",
        "--config.model.d_model=32",
        "--config.model.n_heads=2",
        "--config.model.d_ff=64",
        "--config.data.segment_len=8",
        "--config.data.batch_size=4",
        "--config.train.eval_every=0",
    ]  # fmt: skip
