"""Deviceless compiles for TPU slices (``relpos_jax.aot``): the real TPU compiler, Mosaic included,
on abstract devices from libtpu's topologies, on this CPU host. Needs the tpu extra (libtpu), which
``make test-tpu`` installs in ``.venv-tpu``; skipped elsewhere. Lowering to MLIR (``jax.export``,
``kernel_lowering_test``) is not compiling: Mosaic refused the relative shift of every relative
scheme only here."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest

from bench.mfu import step_flops
from relpos_jax import aot
from relpos_jax.config import ConfigError, load_config
from relpos_jax.errors import AcceleratorError
from tests.helpers import ROOT

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("libtpu") is None, reason="needs the tpu extra (libtpu): make test-tpu"
)
# every scheme the kernels take (DeBERTa runs the tiled path)
KERNEL_SCHEMES = (
    "txl",
    "shaw",
    "t5",
    "alibi",
    "kerple",
    "fire",
    "rope",
    "none",
    "sinusoid",
    "learned",
)


def _small(*overrides: str):
    """txl_small at one layer of two heads, segment 256 and memory 128 (two query blocks of 128,
    three key blocks), batch 4 (one row a chip of a 2×2 slice)."""
    return load_config(
        ROOT / "configs" / "txl_small.py",
        [
            "model.n_layers=1", "model.n_heads=2", "model.d_ff=256", "model.mem_len=128",
            "data.segment_len=256", "data.batch_size=4", *overrides,
        ],
    )  # fmt: skip


@pytest.mark.parametrize("topology", ["v5e:2x2", "v5p:2x2x1"])
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("head_dim", [64, 128])
@pytest.mark.parametrize("scheme", KERNEL_SCHEMES)
def test_every_scheme_trains_through_the_mosaic_kernels(scheme, head_dim, dtype, topology):
    """The training step (forward and backward kernels, attention dropout on) compiles."""
    config = _small(
        f"model.position={scheme}", f"model.d_model={2 * head_dim}", f"model.dtype={dtype}",
        "model.attention_impl=kernel", "model.dropatt=0.1",
    )  # fmt: skip
    program = aot.train_step(config, aot.topology(topology))
    assert program.flops > 0 and 0 < program.chip_bytes < aot.hbm_bytes(aot.topology(topology))


def test_same_length_and_clamp_compile_through_the_kernels():
    config = _small(
        "model.d_model=128", "model.attention_impl=kernel", "model.same_length=True",
        "model.clamp_len=64", "model.dtype=bfloat16",
    )  # fmt: skip
    assert aot.train_step(config, aot.topology("v5e:2x2")).flops > 0


def test_tpu_v4_takes_the_tiled_attention_and_refuses_the_kernels_in_one_line(capfd):
    """Mosaic has no strided rotation before v5: auto says so in one line and runs tiled."""
    v4 = aot.topology("v4:2x2x1")
    assert [d.device_kind for d in v4] == ["TPU v4"] * 4  # one device a chip (megacore)
    auto = aot.train_step(_small("model.d_model=128", "model.attention_impl=auto"), v4)
    assert auto.flops > 0
    warning = [line for line in capfd.readouterr().err.splitlines() if "tiled" in line]
    assert warning == [
        "warning: model.attention_impl=auto takes the tiled attention: Mosaic on TPU v4 has no "
        "strided rotation (the kernels need v5 or later)"
    ]
    with pytest.raises(ConfigError, match=r"^model\.attention_impl='kernel' is invalid; Mosaic"):
        aot.train_step(_small("model.d_model=128", "model.attention_impl=kernel"), v4)


def test_a_slice_of_four_hosts_compiles_both_steps_with_the_flops_of_the_model():
    """txl_small (dense, one layer) on v5e 4×4: 16 chips over 4 hosts, data 4 × tensor 4. The
    compiler's FLOPs, over the chips, are the model's matrix products (``bench.mfu.step_flops``)
    within the softmax, norms, masks and Adam that it counts beside them: no chip repeats another's
    work. One layer, as the compiler counts the body of a loop (the scanned layers) once."""
    devices = aot.topology("v5e:4x4")
    assert aot.hosts(devices) == 4 and len(devices) == 16
    config = load_config(
        ROOT / "configs" / "txl_small.py",
        ["mesh.data=4", "mesh.tensor=4", "data.batch_size=16", "model.n_layers=1"],
    )
    train = aot.train_step(config, devices)
    assert 1.0 < train.flops * len(devices) / step_flops(config) < 1.3
    evaluation = aot.eval_step(config, devices)
    assert 0 < evaluation.flops < train.flops and evaluation.chip_bytes > 0


def test_a_kernel_block_a_tpu_cannot_take_is_one_line():
    config = _small("model.d_model=128", "model.attention_impl=kernel", "model.kernel_block=64")
    with pytest.raises(ConfigError, match=r"^model\.kernel_block=64 is invalid; a TPU's kernel"):
        aot.train_step(config, aot.topology("v5e:2x2"))


def _aot(*flags: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "bench.aot", "--config", "configs/txl_small.py", *flags],
        cwd=ROOT, capture_output=True, text=True, timeout=900, env={**os.environ},
    )  # fmt: skip


def test_bench_aot_refuses_a_step_that_does_not_fit_and_accepts_the_fields_it_names():
    """txl_small at batch 64, segment and memory 2,048 on v5e (16 GiB a chip): the dense training
    step keeps every layer's logits for the backward (28 GiB a chip); one line names remat, and
    the command with it compiles both steps within HBM."""
    big = ["--topology", "v5e:2x2", "--set", "data.batch_size=64", "--set",
           "data.segment_len=2048", "--set", "model.mem_len=2048"]  # fmt: skip
    refused = _aot(*big, "--steps", "train")
    assert refused.returncode == 2, refused.stderr
    error = [line for line in refused.stderr.splitlines() if line.startswith("error:")]
    assert len(error) == 1 and "it fits with --config.model.remat=True" in error[0], error
    flag = error[0].split("it fits with ")[1].split(" (")[0]
    accepted = _aot(*big, "--set", flag.removeprefix("--config."))
    assert accepted.returncode == 0, accepted.stderr
    assert "train step: compiled" in accepted.stdout and "eval step: compiled" in accepted.stdout


def test_bench_aot_names_the_batch_and_mesh_for_the_papers_batch_on_four_chips():
    refused = _aot("--topology", "v5e:2x2", "--set", "data.batch_size=22", "--steps", "eval")
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines()[-1] == (
        "error: data.batch_size=22 is invalid; it must be a multiple of data·fsdp = 4 mesh "
        "devices: use 20 or 24, or keep 22 with --config.mesh.data=2 --config.mesh.fsdp=1 "
        "--config.mesh.tensor=2 (the heads split over tensor)"
    )


def _window(*overrides: str):
    """One layer of two heads of 64, segment 8,192 + memory 8,192 (the kernels hold the window)."""
    return _small(
        "model.d_model=128", "data.segment_len=8192", "model.mem_len=8192",
        "model.attention_impl=kernel", "model.dtype=bfloat16", *overrides,
    )  # fmt: skip


def test_a_long_window_takes_the_vmem_of_the_chip():
    """16k keys: past the compiler's default scoped VMEM (v5e, as measured here), within the three
    quarters of its 128 MiB the kernels ask for (``launch.vmem_limit``)."""
    program = aot.train_step(_window(), aot.topology("v5e:2x2"))
    assert 0 < program.chip_bytes < aot.hbm_bytes(aot.topology("v5e:2x2"))


def test_a_window_beyond_the_vmem_of_the_chip_is_one_line():
    """v5p has 64 MiB a TensorCore: the same window is refused, naming the fix."""
    with pytest.raises(AcceleratorError) as error:
        aot.train_step(_window(), aot.topology("v5p:2x2x1"))
    assert str(error.value) == (
        "model.attention_impl='kernel' is invalid on TPU v5: the attention kernels hold the "
        "layer's whole window (data.segment_len=8192 + model.mem_len=8192) in VMEM, more than it "
        "has; use --config.model.attention_impl=tiled, or a shorter segment or memory"
    )


def test_auto_takes_the_tiled_path_where_the_window_is_beyond_the_vmem_of_the_chip():
    """The window the kernels cannot hold on v5p (above): ``auto`` takes the tiled path there."""
    program = aot.train_step(_window("model.attention_impl=auto"), aot.topology("v5p:2x2x1"))
    assert program.kernel_calls == 0


@pytest.mark.parametrize(
    ("topology", "scheme", "length", "head_dim", "dtype"),
    [
        ("v5p:2x2x1", "txl", 4096, 64, "bfloat16"),  # the bound: 40 of 48 MiB
        ("v5p:2x2x1", "t5", 3072, 128, "float32"),  # 38
        ("v5e:2x2", "txl", 9728, 64, "bfloat16"),  # 93 of 96
        ("v5e:2x2", "shaw", 4096, 128, "float32"),  # 71
    ],
)
def test_every_window_the_vmem_bound_admits_compiles(topology, scheme, length, head_dim, dtype):
    """``kernel.fit.mosaic_vmem_bytes`` is an upper bound: a window it admits, near the limit,
    compiles through the kernels (segment and memory ``length`` each, two heads)."""
    config = _small(
        f"model.position={scheme}", f"model.d_model={2 * head_dim}", f"model.dtype={dtype}",
        f"data.segment_len={length}", f"model.mem_len={length}", "model.attention_impl=auto",
    )  # fmt: skip
    program = aot.train_step(config, aot.topology(topology))
    assert program.kernel_calls > 0
