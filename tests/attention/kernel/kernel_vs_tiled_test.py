"""``model.attention_impl="kernel"`` equals the tiled path through the whole model for every scheme
the kernels run, on both kernel variants (Triton and Mosaic, in Pallas' interpreter): logits and
the gradient of every parameter, with a full, a partly valid and an empty memory, and with
same_length and clamp_len; greedy generation; attention dropout; DeBERTa falls back to the
tiled path. The kernels against a float64 reference are ``kernel_vs_reference_test.py``."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from relpos_jax import ConfigError, TransformerLM, generate, schemes
from relpos_jax.attention import fused
from relpos_jax.attention.kernel import api as kernel_api
from relpos_jax.config import POSITIONS
from relpos_jax.evaluate import with_config
from tests.helpers import assert_dropout_gradient_is_the_forwards

pytestmark = pytest.mark.usefixtures("float32_products")  # conftest.py: IEEE float32 on a GPU

MEM, SEG = 13, 20  # window 33: blocks of 16 give 2 query blocks and 3 key blocks
FUSED = [p for p in POSITIONS if schemes.get(p).fused]


def _pair(position, **overrides):
    config = dict(
        position=position, n_layers=1, d_model=32, n_heads=2, d_ff=64, mem_len=MEM, dropout=0.0,
        init_std=0.1, t5={"max_distance": 12, "num_buckets": 8}, shaw={"max_distance": 3},
        kernel_block=16, deberta={"bucket_size": 4, "max_position": 16}, **overrides,
    )  # fmt: skip
    tiled = TransformerLM(dict(config, attention_impl="tiled", key_tile=5, query_tile=3),
                          rngs=nnx.Rngs(0))  # fmt: skip
    return tiled, with_config(tiled, dataclasses.replace(tiled.config, attention_impl="kernel"))


@nnx.jit
def _logits_and_gradients(model, tokens, mems):
    loss = lambda model: (model(tokens, mems)[0] ** 2).mean()  # noqa: E731
    return model(tokens, mems)[0], nnx.grad(loss)(model)


def _memories(model, tokens):
    full = nnx.jit(lambda m, t: m(t, m.init_mems(t.shape[0]))[1])(model, tokens)
    return {
        f"{n} valid": full._replace(valid=jnp.asarray(n, full.valid.dtype)) for n in (MEM, 4, 0)
    }


def _compare(tiled, kernel, tokens, case):
    for name, mems in _memories(tiled, tokens).items():
        (want_logits, want), (got_logits, got) = (
            _logits_and_gradients(m, tokens, mems) for m in (tiled, kernel)
        )
        np.testing.assert_allclose(got_logits, want_logits, rtol=2e-5, atol=2e-5,
                                   err_msg=f"{case}, {name}")  # fmt: skip
        largest = max(float(jnp.abs(a).max()) for a in jax.tree.leaves(want))
        got = dict(jax.tree.leaves_with_path(got))
        for path, a in jax.tree.leaves_with_path(want):
            scale = max(float(jnp.abs(a).max()), 1e-3 * largest)
            np.testing.assert_allclose(got[path] / scale, a / scale, atol=1e-4,
                                       err_msg=f"{case}, {name}: {jax.tree_util.keystr(path)}")  # fmt: skip


@pytest.mark.parametrize("backend", ["triton", "mosaic"])
@pytest.mark.parametrize("position", FUSED)
def test_kernel_equals_tiled_with_memory(position, backend, monkeypatch):
    monkeypatch.setattr(fused, "INTERPRET_BACKEND", backend)
    tiled, kernel = _pair(position)
    tokens = jax.random.randint(jax.random.PRNGKey(1), (2, SEG), 0, 256)
    _compare(tiled, kernel, tokens, f"{position} on {backend}")


@pytest.mark.parametrize("position", ["txl", "shaw", "t5"])
def test_kernel_equals_tiled_with_same_length_and_clamp_len(position):
    tiled, kernel = _pair(position, same_length=True, clamp_len=6)
    tokens = jax.random.randint(jax.random.PRNGKey(2), (2, SEG), 0, 256)
    _compare(tiled, kernel, tokens, f"{position}, same_length")


@pytest.mark.parametrize("position", [p for p in POSITIONS if p not in FUSED])
def test_schemes_the_kernels_do_not_run_take_the_tiled_path(position):
    tiled, kernel = _pair(position)
    assert fused.path(kernel.config, SEG, MEM + SEG, None, False) == "tiled"
    tokens = jax.random.randint(jax.random.PRNGKey(3), (2, SEG), 0, 256)
    mems = tiled.init_mems(2)
    np.testing.assert_allclose(kernel(tokens, mems)[0], tiled(tokens, mems)[0], atol=1e-6)


def test_auto_takes_the_kernels_on_a_tpu_else_dense_then_tiled_by_length():
    tiled, _ = _pair("txl")
    auto = dataclasses.replace(tiled.config, attention_impl="auto")
    short, long = (
        fused.path(auto, 64, fused.DENSE_KEYS, None, False),
        fused.path(auto, 64, fused.DENSE_KEYS + 1, None, False),
    )
    # on a GPU only where one of its kind measured them faster (kernel.faster; at 64 queries: no)
    on_tpu = kernel_api.backend_of() == "mosaic"
    assert (short, long) == (("kernel", "kernel") if on_tpu else ("dense", "tiled"))
    assert fused.path(auto, 64, 64, None, True) == "tiled"  # a segment split over devices
    mask = jnp.ones((SEG, MEM + SEG), bool)
    assert fused.path(auto, 64, 64, mask, False) in ("dense", "tiled")  # the kernels take no mask


def test_a_bad_kernel_block_or_head_dim_is_refused_in_one_line():
    for value in (8, 48):
        with pytest.raises(ConfigError, match=r"^model\.kernel_block=.* is invalid; [^\n]+$"):
            TransformerLM(dict(position="txl", kernel_block=value), rngs=nnx.Rngs(0))
    narrow = dict(position="txl", d_model=32, n_heads=4, attention_impl="kernel")  # head dim 8
    with pytest.raises(ConfigError, match=r"^model\.attention_impl=.* is invalid; [^\n]+$"):
        TransformerLM(narrow, rngs=nnx.Rngs(0))
    TransformerLM(dict(narrow, position="deberta"), rngs=nnx.Rngs(0))  # the tiled path runs it


@pytest.mark.parametrize("position", ["txl", "shaw", "alibi"])
def test_generation_through_the_kernels_equals_the_tiled_path(position):
    """Greedy one-token steps (a query block of one padded position) over a key/value memory."""
    tiled, kernel = _pair(position)
    prompt = jax.random.randint(jax.random.PRNGKey(4), (2, 9), 0, 256)
    want = generate(tiled, prompt, 6, temperature=0.0)
    np.testing.assert_array_equal(generate(kernel, prompt, 6, temperature=0.0), want)


def test_attention_dropout_through_the_kernels_drops_the_same_weights_forward_and_backward():
    """dropatt 0.3 in training: the kernels' hash draws the same masks forward and backward."""
    _, kernel = _pair("txl", dropatt=0.3)
    tokens = jax.random.randint(jax.random.PRNGKey(5), (2, SEG), 0, 256)
    mems = _memories(kernel, tokens)[f"{MEM} valid"]
    assert_dropout_gradient_is_the_forwards(kernel, tokens, mems, moves=1e-6)


@pytest.mark.slow
def test_kernels_on_a_data_fsdp_tensor_mesh_equal_one_device():
    """8 simulated devices (data 2, fsdp 2, tensor 2): each runs the kernels on its batch rows and
    heads (``fused._per_device``); logits and every gradient as on one device."""
    from tests.attention.context_parallel_test import run_worker

    variants = "txl,shaw,t5,rope"
    result = run_worker("kernel", variants)
    assert sorted(result) == sorted(variants.split(","))
    for variant, diff in result.items():
        assert diff["logits"] <= 1e-5 and diff["grads"] <= 1e-5, (variant, diff)
