"""``train.loss_from``: the training loss counts each segment's positions from it on (Dai et al.'s
"half loss" at ``segment_len // 2``), with or without micro-batches; out-of-range values are refused
in one line."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from relpos_jax.config import Config, ConfigError, load_config
from relpos_jax.train_step import make_optimizer, train_step_fn
from tests.helpers import ROOT, tiny_model

T, HALF = 8, 4
TOKENS = np.random.default_rng(0).integers(0, 256, (4, T + 1)).astype(np.int32)


def _step_loss(loss_from: int, grad_accum: int = 1) -> float:
    """The loss a training step reports, for a model without dropout (the same weights each call)."""
    model = tiny_model("sinusoid", mem_len=0)
    train = Config.from_any(load_config(ROOT / "configs" / "txl_small.py")).train
    optimizer = nnx.Optimizer(model, make_optimizer(train), wrt=nnx.Param)
    graphdef, state = nnx.split((model, optimizer))
    batch = {"inputs": jnp.asarray(TOKENS[:, :-1]), "targets": jnp.asarray(TOKENS[:, 1:])}
    step = jax.jit(functools.partial(train_step_fn, graphdef, grad_accum, loss_from=loss_from))
    _, _, metrics = step(state, batch, model.init_mems(4))
    return float(metrics["loss"])


def _log_probs() -> np.ndarray:
    model = tiny_model("sinusoid", mem_len=0)
    inputs, targets = jnp.asarray(TOKENS[:, :-1]), jnp.asarray(TOKENS[:, 1:])
    log_probs, _ = model.target_log_probs(inputs, targets, model.init_mems(4))
    return np.asarray(log_probs, np.float64)


def test_the_loss_counts_the_positions_from_loss_from_on():
    log_probs = _log_probs()
    np.testing.assert_allclose(_step_loss(0), -log_probs.mean(), rtol=1e-5)
    np.testing.assert_allclose(_step_loss(HALF), -log_probs[:, HALF:].mean(), rtol=1e-5)
    np.testing.assert_allclose(_step_loss(HALF, grad_accum=2), _step_loss(HALF), rtol=1e-5)
    assert abs(_step_loss(HALF) - _step_loss(0)) > 1e-3  # the first half changed the full loss


@pytest.mark.parametrize("loss_from", [-1, 64])
def test_a_loss_start_outside_the_segment_is_refused_in_one_line(loss_from):
    config = load_config(
        ROOT / "configs" / "txl_small.py", ["data.segment_len=64", f"train.loss_from={loss_from}"]
    )
    with pytest.raises(ConfigError) as error:
        Config.from_any(config)
    message = str(error.value)
    assert message.startswith(f"train.loss_from={loss_from} is invalid; ") and "\n" not in message
