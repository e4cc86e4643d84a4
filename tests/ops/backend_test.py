"""The model as a GPU or TPU runs it (``ops.backend``): plain float32-accumulated products, keys and
values ``[B, K, N, H]``, JAX's own dropout; the same numbers as the CPU form, and a program that a
CPU host traces for a GPU (``backend.target``) without any of XLA:CPU's layout work in it."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from relpos_jax import schemes
from relpos_jax.ops import backend
from relpos_jax.ops.dropout import Dropout
from relpos_jax.train_step import train_step_fn
from tests.helpers import ROOT, tiny_model

TOKENS = jnp.arange(14).reshape(2, 7) * 7 % 256


def _logits(position: str, keys_values: bool = False, **overrides) -> np.ndarray:
    model = tiny_model(position, **overrides)
    assert model.layer(0).attention.kv_layout == (
        schemes.get(position).kv_layout if backend.on_cpu() else "bknh"
    )
    _, mems = model(TOKENS, model.init_mems(2, keys_values=keys_values))  # a memory of states
    logits, _ = model(TOKENS[:, ::-1], mems)
    return np.asarray(logits)


@pytest.mark.parametrize("position", schemes.names())
def test_the_accelerator_form_gives_the_cpu_forms_logits(position):
    cpu = _logits(position)
    with backend.target("gpu"):
        gpu = _logits(position)
    np.testing.assert_allclose(gpu, cpu, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("position", ["txl", "rope", "shaw"])
def test_the_accelerator_form_gives_the_cpu_forms_logits_in_tiles_and_with_cached_keys(position):
    for settings in (
        dict(attention_impl="tiled", key_tile=4, query_tile=4),
        dict(keys_values=True),
    ):
        cpu = _logits(position, **settings)
        with backend.target("tpu"):
            accelerator = _logits(position, **settings)
        np.testing.assert_allclose(accelerator, cpu, rtol=1e-5, atol=1e-5, err_msg=str(settings))


def test_the_target_overrides_the_host_and_ends_with_its_block():
    host = backend.platform()
    with backend.target("cuda"):
        assert backend.platform() == "gpu" and not backend.on_cpu()
    assert backend.platform() == host


@pytest.mark.parametrize(
    "kind, generation, vmem_mib",
    [("TPU v4", 4, 16), ("TPU v5 lite", 5, 128), ("TPU v5", 5, 64), ("TPU v6 lite", 6, 128),
     ("TPU7x", 7, 64), ("a TPU of the future", None, None)],
)  # fmt: skip
def test_the_target_tpu_gives_its_generation_and_the_kernels_vmem(kind, generation, vmem_mib):
    """What the Mosaic kernels read: the strided rotation from v5 on, three quarters of a
    TensorCore's VMEM (JAX's ``pallas.tpu`` figures) as their limit; the compiler's default where
    the chip is unknown, and none off a TPU."""
    from relpos_jax.attention.kernel import launch

    with backend.target("tpu", kind):
        assert backend.tpu_generation() == generation
        assert backend.tpu_vmem_bytes() == (vmem_mib and vmem_mib << 20)
        assert launch.vmem_limit() == (vmem_mib and (vmem_mib << 20) * 3 // 4)
    with backend.target("gpu", "NVIDIA H200"):
        assert backend.tpu_vmem_bytes() is None and backend.tpu_generation() is None


def test_accelerator_dropout_is_jax_bernoulli():
    x = jnp.ones((64, 256))
    key = jax.random.key(3)
    with backend.target("gpu"):
        dropped = Dropout(0.25, rngs=nnx.Rngs(0))(x, deterministic=False, rngs=key)
    kept = jax.random.bernoulli(key, 0.75, x.shape)
    np.testing.assert_array_equal(dropped, jnp.where(kept, 1 / 0.75, 0.0))
    cpu = Dropout(0.25, rngs=nnx.Rngs(0))(x, deterministic=False, rngs=key)
    assert abs(float((cpu == 0).mean()) - 0.25) < 0.02  # the CPU's hash: the same rate
    assert not bool((cpu == dropped).all())


def _exported_train_step(platform: str) -> str:
    """The StableHLO of a bf16 training step (dropout on) traced for ``platform``."""
    from relpos_jax.config import Config, load_config
    from relpos_jax.train_step import make_optimizer

    train = Config.from_any(load_config(ROOT / "configs" / "txl_small.py")).train

    with backend.target(platform):
        model = tiny_model("rope", dtype="bfloat16", dropout=0.1, mem_len=8)
        optimizer = nnx.Optimizer(model, make_optimizer(train), wrt=nnx.Param)
        graphdef, state = nnx.split((model, optimizer))
        batch = {k: jnp.zeros((2, 8), jnp.int32) for k in ("inputs", "targets")}
        step = jax.jit(functools.partial(train_step_fn, graphdef, 1))
        exported = jax.export.export(step, platforms=[platform])(state, batch, model.init_mems(2))
    return exported.mlir_module()


@pytest.mark.slow
def test_a_gpu_training_step_is_built_on_a_cpu_host_without_the_cpus_layout_work():
    gpu, cpu = _exported_train_step("cuda"), _exported_train_step("cpu")
    # XLA:CPU's operand layouts (precision._product) hold their copies with optimization barriers
    assert "optimization_barrier" in cpu and "optimization_barrier" not in gpu
    products = [line for line in gpu.splitlines() if "stablehlo.dot_general" in line]
    bf16_in = [line for line in products if line.split("->")[0].count("bf16") >= 2]
    assert bf16_in and all("xf32>" in line.split("->")[-1] for line in bf16_in)  # f32 accumulation
