"""Every kernel, forward and backward, lowers for both accelerators on this CPU:
``jax.export`` compiles the Pallas calls to Triton (``cuda``) and to Mosaic (``tpu``) without a
device. The term sets are those of the schemes: content only (RoPE, absolute, none), a band
(Transformer-XL), a band and a value table (Shaw), a bias table (T5, ALiBi, KERPLE), FIRE's bias
evaluated per tile; in bfloat16, and every term with same_length and dropout in float32."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from relpos_jax.attention.kernel import cubin

B, T, M, N, H = 2, 256, 128, 4, 64
PLATFORMS = {"cuda": "triton", "tpu": "mosaic"}
SCHEMES = {
    "rope, absolute, none": cubin.TERMS["rope"],
    "txl": cubin.TERMS["txl"],
    "shaw": cubin.TERMS["shaw"],
    "t5, alibi, kerple": cubin.TERMS["t5"],
    "fire": cubin.TERMS["fire"],
}


def _export(platform: str, terms, dtype, **options):
    fn, shapes = cubin.attention_step(terms, H, dtype, backend=PLATFORMS[platform], batch=B,
                                      queries=T, memory=M, heads=N, **options)  # fmt: skip
    exported = jax.export.export(
        jax.jit(fn),
        platforms=[platform],
        disabled_checks=[jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")],
    )(*shapes)
    return exported.mlir_module()


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_forward_and_backward_lower_in_bfloat16(scheme, platform):
    module = _export(platform, SCHEMES[scheme], jnp.bfloat16)
    call = {"cuda": "__gpu$xla.gpu.triton", "tpu": "tpu_custom_call"}[platform]
    assert module.count(call) == 2  # the forward kernel and the backward kernel


@pytest.mark.parametrize("platform", PLATFORMS)
def test_every_term_with_same_length_and_dropout_lowers_in_float32(platform):
    module = _export(platform, ("band", "bias", "values", "tile"), jnp.float32, max_distance=M,
                     dropatt=0.1, seed=jnp.int32(3))  # fmt: skip
    assert "tpu_custom_call" in module or "__gpu$xla.gpu.triton" in module


def test_float32_products_are_tf32_by_default_and_ieee_in_the_kernel_tests():
    """On a GPU the float32 kernels multiply in TF32 unless JAX's matmul precision says otherwise
    (as XLA's products do); the numeric kernel tests (``conftest.py``: "highest") hold them to
    float32, the precision of their float64 comparisons. Read off the Triton IR Pallas emits."""
    fn, shapes = cubin.attention_step(("band",), 16, jnp.float32, block=16, queries=32, memory=32)
    default = [kernel.ir for kernel in cubin.lower(fn, *shapes)]
    with jax.default_matmul_precision("highest"):  # conftest.py's float32_products
        tested = [kernel.ir for kernel in cubin.lower(fn, *shapes)]
    assert all("inputPrecision = tf32" in ir for ir in default)  # forward and backward
    assert len(tested) == 2 and not any("inputPrecision = tf32" in ir for ir in tested)
