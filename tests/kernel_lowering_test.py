"""Every kernel, forward and backward, lowers for both accelerators on this CPU:
``jax.export`` compiles the Pallas calls to Triton (``cuda``) and to Mosaic (``tpu``) without a
device. The term sets are those of the schemes: content only (RoPE, absolute, none), a band
(Transformer-XL), a band and a value table (Shaw), a bias table (T5, ALiBi, KERPLE), FIRE's bias
evaluated per tile; in bfloat16, and every term with same_length and dropout in float32."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import pytest

from relpos_jax.attention import kernel

B, T, M, N, H = 2, 256, 128, 4, 64
K = M + T
PLATFORMS = {"cuda": "triton", "tpu": "mosaic"}
SCHEMES = {
    "rope, absolute, none": (),
    "txl": ("band",),
    "shaw": ("band", "values"),
    "t5, alibi, kerple": ("bias",),
    "fire": ("fire",),
}


def _export(platform: str, terms, dtype, **options):
    def loss_and_grads(q, k, v, a, logit_rows, bias_rows, value_rows, fire_rows):
        tables = {
            "a": a if "band" in terms else None,
            "logit_rows": logit_rows if "band" in terms else None,
            "bias_rows": bias_rows if "bias" in terms else None,
            "value_rows": value_rows if "values" in terms else None,
            "fire_rows": fire_rows if "fire" in terms else None,
        }

        def loss(q, k, v, tables):
            out = kernel.attend(q, k, v, key_valid=jnp.ones(K, bool), scale=H**-0.5,
                                backend=PLATFORMS[platform], fire_hidden=32 * ("fire" in terms),
                                **tables, **options)  # fmt: skip
            return out.astype(jnp.float32).sum()

        return jax.value_and_grad(loss, argnums=(0, 1, 2, 3))(q, k, v, tables)

    shape = lambda *s, dtype=dtype: jax.ShapeDtypeStruct(s, dtype)  # noqa: E731
    args = (
        shape(B, T, N, H), shape(B, K, N, H), shape(B, K, N, H), shape(B, T, N, H),
        shape(N, K, H, dtype=jnp.float32), shape(N, K, dtype=jnp.float32),
        shape(1, K, H, dtype=jnp.float32), shape(N, 1, 128, dtype=jnp.float32),
    )  # fmt: skip
    exported = jax.export.export(
        jax.jit(loss_and_grads),
        platforms=[platform],
        disabled_checks=[jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")],
    )(*args)
    return exported.mlir_module()


@pytest.mark.parametrize("platform", PLATFORMS)
@pytest.mark.parametrize("scheme", SCHEMES)
def test_forward_and_backward_lower_in_bfloat16(scheme, platform):
    module = _export(platform, SCHEMES[scheme], jnp.bfloat16)
    call = {"cuda": "__gpu$xla.gpu.triton", "tpu": "tpu_custom_call"}[platform]
    assert module.count(call) == 2  # the forward kernel and the backward kernel


@pytest.mark.parametrize("platform", PLATFORMS)
def test_every_term_with_same_length_and_dropout_lowers_in_float32(platform):
    module = _export(platform, ("band", "bias", "values", "fire"), jnp.float32, max_distance=M,
                     dropatt=0.1, seed=jnp.int32(3))  # fmt: skip
    assert "tpu_custom_call" in module or "__gpu$xla.gpu.triton" in module
