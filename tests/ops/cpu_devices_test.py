"""``cpu_devices``: one CPU device per core, the count fitted to the mesh and the batches, and
evaluation over those devices equal to evaluation on one."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from relpos_jax.config import MeshConfig
from relpos_jax.ops.cpu_devices import device_count_for


@pytest.mark.parametrize(
    ("batch_sizes", "mesh", "cores", "expected"),
    [
        ((16, 16), MeshConfig(), 2, 2),
        ((16, 16), MeshConfig(), 8, 8),
        ((12, 16), MeshConfig(), 8, 4),  # 4 is the largest count ≤ 8 dividing 12 and 16
        ((15,), MeshConfig(), 4, 3),
        ((7,), MeshConfig(), 2, 1),  # nothing divides 7 rows: one device
        ((16,), MeshConfig(data=1), 4, 1),  # a mesh of fixed size 1 keeps one device
        ((16,), MeshConfig(data=-1, tensor=2), 6, 4),  # 6 devices: 3 batch rows; 4: 2 rows
        ((16,), MeshConfig(data=2, fsdp=1, tensor=1), 8, 2),
        ((16,), MeshConfig(), 1, 1),
    ],
)
def test_device_count_fits_mesh_and_batches(batch_sizes, mesh, cores, expected):
    assert device_count_for(batch_sizes, mesh, cores) == expected


PROGRAM = """
import json, sys
import jax
from relpos_jax.ops import cpu_devices
if sys.argv[1] == "late":
    jax.devices()  # JAX has started
chosen = cpu_devices.one_device_per_core([16])
print(json.dumps({"chosen": chosen, "devices": jax.device_count(), "cores": cpu_devices.cores()}))
"""


def _run(mode: str, **env) -> dict:
    environment = {k: v for k, v in os.environ.items() if k not in ("JAX_NUM_CPU_DEVICES",)}
    environment.update({"JAX_PLATFORMS": "cpu", "XLA_FLAGS": "", **env})
    out = subprocess.run(
        [sys.executable, "-c", PROGRAM, mode], capture_output=True, text=True, check=True,
        env=environment,
    ).stdout  # fmt: skip
    return json.loads(out.strip().splitlines()[-1])


def test_one_device_per_core_before_jax_starts():
    result = _run("early")
    expected = device_count_for([16], MeshConfig(), result["cores"])
    assert result["chosen"] == expected == result["devices"]


def test_environment_and_a_started_jax_keep_their_devices():
    chosen = _run("early", JAX_NUM_CPU_DEVICES="1")
    assert (chosen["chosen"], chosen["devices"]) == (None, 1)
    forced = _run("early", XLA_FLAGS="--xla_force_host_platform_device_count=3")
    assert (forced["chosen"], forced["devices"]) == (None, 3)
    late = _run("late")
    assert (late["chosen"], late["devices"]) == (None, 1)


EVALUATION = """
import json
import jax
from flax import nnx
from relpos_jax import TransformerLM, sharding
from relpos_jax.config import MeshConfig
from relpos_jax.data.pipeline import ArrayStream
from relpos_jax.evaluate import evaluate
import numpy as np

stream = ArrayStream(np.random.default_rng(0).integers(0, 256, 3001))
out = {}
for name in ("txl", "rope"):
    model = TransformerLM(dict(position=name, n_layers=1, d_model=32, n_heads=2, d_ff=64, mem_len=16),
                          rngs=nnx.Rngs(0))
    kw = dict(batch_size=4, segment_len=16, mem_len=16)
    one = evaluate(model, stream, **kw)["loss"]
    mesh = sharding.make_mesh(MeshConfig())
    split = evaluate(model, stream, mesh=mesh, **kw)["loss"]
    odd = evaluate(model, stream, mesh=mesh, **{**kw, "batch_size": 3})["loss"]  # 3 rows: replicated
    out[name] = [one, split, odd, evaluate(model, stream, **{**kw, "batch_size": 3})["loss"]]
print(json.dumps({"devices": jax.device_count(), "losses": out}))
"""


def test_evaluation_split_over_devices_equals_one_device():
    environment = {**os.environ, "JAX_PLATFORMS": "cpu", "JAX_NUM_CPU_DEVICES": "2"}
    out = subprocess.run(
        [sys.executable, "-c", EVALUATION], capture_output=True, text=True, env=environment
    )
    assert out.returncode == 0, out.stderr[-2000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["devices"] == 2
    for one, split, odd, odd_one in result["losses"].values():
        assert split == pytest.approx(one, rel=1e-5)
        assert odd == pytest.approx(odd_one, rel=1e-5)
