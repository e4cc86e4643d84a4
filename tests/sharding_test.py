"""Sharded training on simulated CPU devices: every mesh gives the losses of one device, every
parameter has the sharding its rules say, and two processes on loopback equal one process."""

from __future__ import annotations

import json
import os
import pathlib
import socket
import subprocess
import sys

import jax
import pytest
from flax import nnx

from relpos_jax import TransformerLM, sharding
from relpos_jax.config import POSITIONS, ConfigError, MeshConfig

WORKER = pathlib.Path(__file__).resolve().parent / "sharding_worker.py"


def _worker(devices: int, *args, timeout=600) -> subprocess.Popen:
    env = {
        **os.environ,
        # the devices, after the suite's own flags (conftest: compile faster)
        "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} "
        f"--xla_force_host_platform_device_count={devices}",
        "JAX_PLATFORMS": "cpu",
    }
    return subprocess.Popen(
        [sys.executable, str(WORKER), *map(str, args)],
        env=env,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )


def _result(process: subprocess.Popen, timeout=600) -> dict:
    out, err = process.communicate(timeout=timeout)
    assert process.returncode == 0, err[-3000:]
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize(
    ("mesh", "devices", "names"),
    [
        (MeshConfig(data=3), 8, "mesh=(3, 1, 1, 1)"),
        (MeshConfig(data=-1, fsdp=3), 8, "mesh.data=-1"),
        (MeshConfig(data=-1, fsdp=-1), 8, "at most one axis"),
    ],
)
def test_mesh_that_does_not_fit_is_one_line(mesh, devices, names):
    with pytest.raises(ConfigError) as error:
        sharding.mesh_shape(mesh, devices)
    assert names in str(error.value) and "\n" not in str(error.value)


def test_batch_that_does_not_divide_the_data_axes():
    mesh = jax.make_mesh((1, 1, 1, 1), sharding.AXES, devices=jax.devices()[:1])
    sharding.check_batch(8, mesh, 1)
    with pytest.raises(
        ConfigError, match=r"data\.batch_size=6 is invalid; it must be a multiple of the 4"
    ):
        sharding.check_batch(6, mesh, 4)


def test_a_batch_the_slice_does_not_divide_names_the_batches_and_the_mesh_that_would():
    """The paper's enwik8 batch of 22 on 4 chips: 20 or 24 rows, or 22 over data 2 × tensor 2."""
    on_four = jax.sharding.AbstractMesh((4, 1, 1, 1), sharding.AXES)
    with pytest.raises(ConfigError) as error:
        sharding.check_batch(22, on_four, 1)
    message = str(error.value)
    assert "\n" not in message
    assert "use 20 or 24, or keep 22 with --config.mesh.data=2 --config.mesh.fsdp=1 " in message
    assert "--config.mesh.tensor=2" in message
    sharding.check_batch(22, jax.sharding.AbstractMesh((2, 1, 1, 2), sharding.AXES), 1)
    with pytest.raises(ConfigError, match=r"use 8, or keep 3 with --config\.mesh\.data=1 "):
        sharding.check_batch(3, jax.sharding.AbstractMesh((8, 1, 1, 1), sharding.AXES), 1)


@pytest.mark.parametrize("position", POSITIONS)
def test_every_large_parameter_has_logical_axes(position):
    """Only norms, biases and RNG counters may fall back to replication."""
    model = TransformerLM(
        dict(
            position=position,
            n_layers=1,
            d_model=32,
            n_heads=4,
            d_ff=64,
            txl={"untie_r": position == "txl"},
            tie_embeddings=position != "none",
        ),
        rngs=nnx.Rngs(0),
    )
    params = nnx.state(model, nnx.Param)
    is_variable = lambda x: isinstance(x, nnx.Variable)  # noqa: E731
    for path, variable in jax.tree_util.tree_flatten_with_path(params, is_leaf=is_variable)[0]:
        name = sharding.path_string(path)
        axes = sharding.param_axes(variable)
        assert len(axes) == variable.ndim, name
        if name.startswith("blocks/"):  # the layers' stack: one layer's axes follow
            assert axes[0] == "layers", name
            axes = axes[1:]
        if len(axes) >= 2 or name.endswith(("/u", "/v", "up/bias", "head/bias")):
            assert any(a is not None for a in axes), name


@pytest.mark.slow
def test_meshes_train_like_one_device(tmp_path):
    result = _result(_worker(8, "meshes", tmp_path / "run"))
    assert result["devices"] == 8
    one = result["one"]
    assert len(one) == 3
    # rules: layers replicated, embed -> fsdp, heads -> tensor, mlp -> tensor; a layer's w_q is
    # [d_model 64, heads 8, head_dim 8]
    shard_of_w_q = {"2x2x2": [32, 4, 8]}
    assert sorted(result["meshes"]) == sorted(shard_of_w_q)
    for name, run in result["meshes"].items():
        assert max(abs(a - b) for a, b in zip(run["losses"], one, strict=True)) < 1e-4, name
        specs = run["specs"]
        assert specs["0/blocks/attention/w_q/.value"] == "P(None, 'fsdp', 'tensor', None)", name
        assert specs["0/blocks/feed_forward/up/kernel/.value"] == "P(None, 'fsdp', 'tensor')", name
        assert specs["0/embed/embedding/.value"] == "P(None, 'fsdp')", name
        # optimizer moments follow their parameters
        assert (
            specs["1/opt_state/inner_state/1/0/mu/blocks/attention/w_q/.value"]
            == "P(None, 'fsdp', 'tensor', None)"
        )
        assert run["w_q_shard"] == shard_of_w_q[name], name
        assert run["mems"] == "P(None, ('data', 'fsdp'), 'context', None)"
        assert run["compiles"] == 1, name


@pytest.mark.slow
def test_two_processes_on_loopback_equal_one_process(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    workers = [
        _worker(2, "train", tmp_path / "two" / "run", 4, f"127.0.0.1:{port}", 2, pid)
        for pid in (0, 1)
    ]
    results = [_result(w) for w in workers]
    single = _result(_worker(4, "train", tmp_path / "one" / "run", 4))
    assert single["devices"] == 4 and all(r["devices"] == 4 for r in results)
    assert all(
        r["resumed_from"] == 2 for r in [*results, single]
    )  # checkpoint written, then restored
    assert len(single["losses"]) == 4
    assert (
        max(abs(a - b) for a, b in zip(results[0]["losses"], single["losses"], strict=True)) < 1e-4
    )
    # the final validation ran across both processes and scored the same
    assert abs(results[0]["valid_bpc"] - single["valid_bpc"]) < 1e-4
