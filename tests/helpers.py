"""Small builders the tests share."""

from __future__ import annotations

import contextlib
import os
import pathlib
import subprocess
import sys

import pytest
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
        shaw={"max_distance": 3},
        t5={"num_buckets": 8, "max_distance": 12},
        deberta={"bucket_size": 4, "max_position": 16},
        learned={"max_len": 64},
    )
    config.update(overrides)
    return TransformerLM(config, rngs=nnx.Rngs(seed))


def files_under(folder: pathlib.Path) -> list[pathlib.Path]:
    """Every file below ``folder``, sorted."""
    return sorted(p for p in folder.rglob("*") if p.is_file())


def logged_losses(workdir):
    return [(m["step"], m["train/loss"]) for m in read_metrics(workdir) if "train/loss" in m]


def kill_when_logged(command: list[str], workdir, records: int, **env) -> int:
    """Start ``command`` (``env`` added to the environment), SIGKILL it once metrics.jsonl holds
    ``records`` losses; its exit code. The process compiles into a cache of its own (beside
    ``workdir``): a kill can cut short an entry it is writing."""
    import signal
    import time

    cache = pathlib.Path(workdir).parent / f"{pathlib.Path(workdir).name}_jax_cache"
    env = {"JAX_COMPILATION_CACHE_DIR": str(cache), **env}
    process = subprocess.Popen(
        command, cwd=ROOT, env={**os.environ, **env},
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    deadline = time.time() + 240
    while time.time() < deadline and process.poll() is None:
        if len(logged_losses(workdir)) >= records:
            process.send_signal(signal.SIGKILL)
            break
        time.sleep(0.01)
    return process.wait(timeout=60)


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


def assert_dropout_gradient_is_the_forwards(model, tokens, mems, moves: float) -> None:
    """Attention dropout through ``model`` in training: the gradient is the derivative of the loss
    the forward computed (a central difference along it, the same dropout key every call), taken
    along the attention's own parameters (the query projection, W_R, u, v), which the dropped
    weights reach, where a gradient taken with other masks would show; and the loss moves by more
    than ``moves`` against no dropout (the weights are dropped)."""
    import functools

    import jax
    import jax.numpy as jnp
    import numpy as np

    graphdef, params, rest = nnx.split(model, nnx.Param, ...)

    @functools.partial(jax.jit, static_argnames="deterministic")
    def loss(params, rest, deterministic=False):  # the same key every call: rest is not updated
        merged = nnx.merge(graphdef, params, rest)
        return (merged(tokens, mems, deterministic=deterministic)[0] ** 2).mean()

    def in_attention(path) -> bool:
        names = jax.tree_util.keystr(path)
        return any(f"'{name}'" in names for name in ("w_q", "w_r", "u", "v"))

    grads = jax.jit(jax.grad(loss))(params, rest)
    grads = jax.tree.map_with_path(
        lambda path, g: g if in_attention(path) else jnp.zeros_like(g), grads
    )
    norm = jnp.sqrt(sum((g**2).sum() for g in jax.tree.leaves(grads)))
    step = jax.tree.map(lambda g: 1e-2 * g / norm, grads)
    up, down = (loss(jax.tree.map(f, params, step), rest) for f in (jnp.add, jnp.subtract))
    np.testing.assert_allclose((up - down) / 2e-2, norm, rtol=2e-2)
    assert abs(float(loss(params, rest)) - float(loss(params, rest, deterministic=True))) > moves


@contextlib.contextmanager
def evaluation_stopped_before_call(monkeypatch, call: int):
    """Inside it, an evaluation pass stops before its compiled call ``call`` (from 0) as a kill
    would stop it: ``evaluate._blocks`` raises ``KeyboardInterrupt`` there, which it expects."""
    from relpos_jax import evaluate

    blocks_of = evaluate._blocks

    def stopping(batches, size):
        for index, block in enumerate(blocks_of(batches, size)):
            if index == call:
                raise KeyboardInterrupt
            yield block

    with monkeypatch.context() as patched:
        patched.setattr(evaluate, "_blocks", stopping)
        with pytest.raises(KeyboardInterrupt):
            yield
