"""The tiled path equals the dense one for every scheme, through the whole model: logits and the
gradients of every parameter, with memory (full, partly valid, empty), same_length, clamp_len,
Tq ≠ Tk and tiles that divide neither the segment nor the window (``model.attention_impl``)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from relpos_jax import ConfigError, TransformerLM
from relpos_jax.config import POSITIONS
from relpos_jax.evaluate import with_config
from tests.helpers import assert_dropout_gradient_is_the_forwards

MEM = 9  # window K = 9 + 7 = 16 keys; tiles of 5 keys by 3 queries divide neither length


def _pair(position, **overrides):
    """A one-layer dense model and the same parameters under the tiled path."""
    config = dict(
        position=position, n_layers=1, d_model=32, n_heads=2, d_ff=64, mem_len=MEM,
        dropout=0.0, init_std=0.1, t5={"max_distance": 12, "num_buckets": 8},
        shaw={"max_distance": 3}, deberta={"bucket_size": 4, "max_position": 16}, **overrides,
    )  # fmt: skip
    dense = TransformerLM(config, rngs=nnx.Rngs(0))
    tiled = with_config(
        dense, dataclasses.replace(dense.config, attention_impl="tiled", key_tile=5, query_tile=3)
    )
    return dense, tiled


@nnx.jit
def _written_memory(model, tokens):
    return model(tokens, model.init_mems(tokens.shape[0]))[1]


def _memories(model, tokens) -> dict:
    """The memory after 14 tokens (all 9 slots written), then the same states with only the
    newest 4 slots valid (the first key tile wholly invalid, positions starting later), then none
    valid: one shape, so the compiled programs are shared."""
    full = _written_memory(model, tokens.repeat(2, axis=1))
    assert int(full.valid) == MEM
    return {
        f"{written} valid slots": full._replace(valid=jnp.asarray(written, full.valid.dtype))
        for written in (MEM, 4, 0)
    }


def _loss(model, tokens, mems):
    return (model(tokens, mems)[0] ** 2).mean()


@nnx.jit  # one compiled program a model: a third of the time of running it op by op
def _logits_and_gradients(model, tokens, mems):
    return model(tokens, mems)[0], nnx.grad(_loss)(model, tokens, mems)


def _compare(dense, tiled, tokens, mems, case: str):
    (logits_dense, want), (logits_tiled, got) = (
        _logits_and_gradients(model, tokens, mems) for model in (dense, tiled)
    )
    np.testing.assert_allclose(logits_tiled, logits_dense, rtol=1e-5, atol=1e-5, err_msg=case)
    largest = max(float(jnp.abs(a).max()) for a in jax.tree.leaves(want))
    for path, a in jax.tree.leaves_with_path(want):
        b = dict(jax.tree.leaves_with_path(got))[path]
        # Relative to the parameter's own gradient, floored where that is ~0 by symmetry (a bias
        # added to every logit of a head, such as FIRE's last bias, leaves the softmax unchanged).
        scale = max(float(jnp.abs(a).max()), 1e-3 * largest)
        np.testing.assert_allclose(b / scale, a / scale, atol=1e-4, err_msg=f"{case}: {path}")


@pytest.mark.parametrize("position", POSITIONS)
def test_tiled_equals_dense_with_a_full_a_partly_valid_and_an_empty_memory(position):
    dense, tiled = _pair(position)
    tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 7), 0, 256)
    for case, mems in _memories(dense, tokens).items():
        _compare(dense, tiled, tokens, mems, case)


@pytest.mark.parametrize("position", ["txl", "shaw", "t5", "alibi", "rope", "deberta"])
def test_tiled_equals_dense_with_same_length_and_clamp_len(position):
    dense, tiled = _pair(position, same_length=True, clamp_len=4)
    tokens = jax.random.randint(jax.random.PRNGKey(2), (2, 7), 0, 256)
    for case, mems in _memories(dense, tokens).items():
        _compare(dense, tiled, tokens, mems, case)


def test_a_bad_attention_impl_or_tile_is_refused_in_one_line():
    for field, value in (("attention_impl", "flash"), ("key_tile", 0), ("query_tile", -1)):
        with pytest.raises(ConfigError, match=rf"^model\.{field}=.* is invalid; [^\n]+$"):
            TransformerLM(dict(position="txl", **{field: value}), rngs=nnx.Rngs(0))


def test_attention_dropout_in_tiles_is_the_same_in_forward_and_backward():
    """dropatt 0.3 through the whole model in tiles of 5 × 3: the backward redraws each tile's mask
    from its key, so the gradient is the derivative of the loss the forward computed."""
    dense, _ = _pair("txl", dropatt=0.3)
    tiled = with_config(
        dense, dataclasses.replace(dense.config, attention_impl="tiled", key_tile=5, query_tile=3)
    )
    tokens = jax.random.randint(jax.random.PRNGKey(5), (2, 7), 0, 256)
    mems = _memories(dense, tokens)[f"{MEM} valid slots"]
    assert_dropout_gradient_is_the_forwards(tiled, tokens, mems, moves=1e-3)


@pytest.mark.parametrize("position", ["txl", "shaw", "t5", "rope", "deberta"])
def test_a_bfloat16_training_step_in_tiles_is_close_to_dense(position):
    """bfloat16 activations (float32 parameters): the tiles' gradients reach every parameter in
    the parameter's dtype (Transformer-XL's bfloat16 rows of W_R·R once failed here)."""
    dense, tiled = _pair(position, dtype="bfloat16")
    tokens = jax.random.randint(jax.random.PRNGKey(6), (2, 7), 0, 256)
    mems = _memories(dense, tokens)[f"{MEM} valid slots"]
    (_, want), (_, got) = (_logits_and_gradients(m, tokens, mems) for m in (dense, tiled))
    got = dict(jax.tree.leaves_with_path(got))
    for path, a in jax.tree.leaves_with_path(want):
        scale = max(float(jnp.abs(a).max()), 1e-6)
        # bfloat16 rounding of the sums over pairs: a tenth of the largest entry
        np.testing.assert_allclose(got[path] / scale, a / scale, atol=0.1, err_msg=str(path))
