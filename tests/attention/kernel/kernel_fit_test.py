"""How the Triton kernels are launched on a GPU (``kernel.fit``), checked without one: the block
that fits each chip's shared memory, one pipeline stage wherever ``skew`` reads its scratch buffer
back, the launch parameters as they reach Pallas, and a block too large for the chip refused in one
line. That the bound holds for the compiled kernels is ``kernel_cubin_test`` (the triton wheel)."""

from __future__ import annotations

import json

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from relpos_jax.attention import fused, kernel
from relpos_jax.attention.kernel import cubin, faster, fit
from relpos_jax.errors import ConfigError
from relpos_jax.model import TransformerLM
from relpos_jax.ops import backend

H200, A100, RTX_4090 = "NVIDIA H200", "NVIDIA A100-SXM4-80GB", "NVIDIA GeForce RTX 4090"


@pytest.mark.parametrize(
    ("kind", "capacity"),
    [(H200, 232_448), (A100, 166_912), (RTX_4090, 101_376), ("NVIDIA X", 232_448)],
)
def test_the_shared_memory_a_block_may_take_is_the_target_gpus(kind, capacity):
    with backend.target("gpu", kind):
        assert backend.gpu_shared_memory() == capacity
    with backend.target("tpu", "TPU v5 lite"):
        assert backend.gpu_shared_memory() is None


@pytest.mark.parametrize(
    ("terms", "head_dim", "dtype", "capability", "block"),
    [
        (("band",), 64, jnp.bfloat16, 90, 64),  # the H200's first failure: now fits
        (("band",), 128, jnp.float32, 90, 32),  # the backward needs 262,144 B at 64
        (("band", "values"), 128, jnp.bfloat16, 90, 64),
        (("band", "values"), 128, jnp.bfloat16, 80, 32),
        (("band",), 64, jnp.bfloat16, 89, 32),  # the backward: 106,496 B compiled at 64
        (("bias",), 64, jnp.bfloat16, 89, 64),
    ],
)
def test_the_block_is_the_largest_whose_kernels_fit(terms, head_dim, dtype, capability, block):
    size = jnp.dtype(dtype).itemsize
    assert fit.block(terms, head_dim, size, capability) == block
    assert fit.fits(terms, block, head_dim, size, capability)
    if block < fit.BLOCKS[0]:
        assert not fit.fits(terms, 2 * block, head_dim, size, capability)


def test_one_stage_wherever_the_scratch_buffer_is_read_back():
    for terms in (("band",), ("band", "values"), ("bias",)):
        assert fit.stages(terms, backward=False) == 1
    assert fit.stages((), backward=False) == fit.stages(("tile",), backward=False) == 2
    assert all(fit.stages(t, backward=True) == 1 for t in ((), ("band",), ("tile",)))


@pytest.mark.parametrize(("scheme", "stages"), [("txl", 1), ("shaw", 1), ("t5", 1), ("rope", 2)])
def test_pallas_launches_the_kernels_with_them(scheme, stages):
    forward, backward_ = cubin.attention(scheme, 64, jnp.bfloat16)
    assert (forward.num_stages, forward.num_warps) == (stages, 8)
    assert (backward_.num_stages, backward_.num_warps) == (1, 8)
    small = cubin.attention(scheme, 64, jnp.bfloat16, block=16)
    assert [k.num_warps for k in small] == [4, 4]


def test_an_explicit_block_a_gpu_cannot_hold_is_one_line():
    q = jax.ShapeDtypeStruct((1, 128, 2, 64), jnp.bfloat16)
    rows = jax.ShapeDtypeStruct((2, 256, 64), jnp.float32)

    def call(block):
        return lambda q, rows: kernel.attend(q, q, q, kernel.Terms(a=q, logit_rows=rows),
                                             key_valid=jnp.ones(128, bool), scale=1.0, block=block,
                                             backend="triton")  # fmt: skip

    with backend.target("gpu", RTX_4090):
        with pytest.raises(ValueError) as error:
            jax.eval_shape(call(64), q, rows)
        jax.eval_shape(call(32), q, rows)
    assert str(error.value).startswith("kernel attention: block=64 at head dim 64 in bfloat16")
    assert "set model.kernel_block=32" in str(error.value) and "\n" not in str(error.value)


def test_a_model_whose_kernel_block_a_gpu_cannot_hold_is_refused_in_one_line():
    overrides = dict(position="txl", d_model=256, n_heads=2, d_head=128, d_ff=64, n_layers=1,
                     vocab_size=16, attention_impl="kernel", kernel_block=64)  # fmt: skip
    with backend.target("gpu", RTX_4090):
        model = TransformerLM(overrides, rngs=nnx.Rngs(0))
        tokens = jnp.zeros((1, 64), jnp.int32)
        with pytest.raises(ConfigError) as error:
            jax.eval_shape(lambda t: model(t), tokens)
    message = str(error.value)  # the backward of txl at head dim 128 in float32: 106,496 B at 32
    assert message.startswith("model.kernel_block=64 is invalid; its kernels need more shared")
    assert "set 16, or 0" in message and "\n" not in message


@pytest.mark.parametrize(
    ("chip", "position", "dtype", "window", "path"),
    [
        ("TPU v5 lite", "txl", "bfloat16", 8192, "kernel"),  # 79 MiB of the 96 the kernels may take
        ("TPU v5 lite", "txl", "bfloat16", 16384, "tiled"),  # 156 MiB
        ("TPU v5", "txl", "bfloat16", 8192, "tiled"),  # 79 of 48
        ("TPU v5", "txl", "bfloat16", 4096, "kernel"),
        ("TPU v5", "rope", "bfloat16", 8192, "kernel"),  # no table by distance: 42 MiB
        ("TPU v5", "t5", "float32", 4096, "tiled"),  # bias table and f32: 50 MiB
    ],
)
def test_auto_on_a_tpu_takes_the_tiled_path_where_the_kernels_would_not_fit_its_vmem(
    chip, position, dtype, window, path
):
    """Segment and memory ``window`` each, two heads of 64 (``fit.mosaic_vmem_bytes``; that the
    compiler takes every window the bound admits is ``tpu_compile_test``)."""
    config = TransformerLM(dict(position=position, d_model=128, n_heads=2, d_ff=64, n_layers=1,
                                vocab_size=16, attention_impl="auto", dtype=dtype),
                           rngs=nnx.Rngs(0)).config  # fmt: skip
    with backend.target("tpu", chip):
        assert fused.path(config, window, 2 * window, None, False) == path


MEASURED = {"NVIDIA H200": {"txl": {"1024": False, "4096": True, "8192": True}}}


@pytest.mark.parametrize(
    ("kind", "queries", "taken"),
    [("NVIDIA H200", 512, False), ("NVIDIA H200", 2048, False), ("NVIDIA H200", 4096, True),
     ("NVIDIA H200", 32768, True), ("NVIDIA A100-SXM4-80GB", 8192, False)],
)  # fmt: skip
def test_auto_on_a_gpu_takes_the_kernels_only_where_one_of_its_kind_measured_them_faster(
    monkeypatch, kind, queries, taken
):
    """``kernel.faster``: from the longest measured length not beyond this one; another kind of
    GPU, or a length shorter than any measured, takes dense or tiled."""
    monkeypatch.setattr(faster, "_devices", lambda: MEASURED)
    config = TransformerLM(dict(position="txl", d_model=128, n_heads=2, d_ff=64, n_layers=1,
                                vocab_size=16, attention_impl="auto"), rngs=nnx.Rngs(0)).config  # fmt: skip
    with backend.target("gpu", kind):
        path = fused.path(config, queries, 2 * queries, None, False)
    assert (path == "kernel") == taken
    assert path in ("kernel", "dense", "tiled")


def test_the_shipped_table_of_measured_gpus_is_what_bench_gpu_wrote():
    """Empty until a GPU run fills it: then auto takes dense or tiled on every GPU."""
    table = json.loads(faster.TABLE.read_text())
    assert "bench.gpu_render --faster" in table["about"]
    for kind, schemes in table["devices"].items():
        assert kind.startswith("NVIDIA") and all(isinstance(v, dict) for v in schemes.values())


def test_the_cubin_term_sets_are_fits_keys():
    """``kernel.cubin.TERMS`` names each scheme family's terms as ``fit`` keys them (its order)."""
    for terms in cubin.TERMS.values():
        assert fit.terms_of(*(t in terms for t in fit.TERMS)) == terms
