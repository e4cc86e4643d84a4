"""Context parallelism on 8 simulated CPU devices: the segment and the memory split over the mesh's
``context`` axis give, for every scheme, the logits, loss and gradients of one device; a
(data 2, context 2, tensor 2) mesh trains and validates like one device; the zig-zag order
balances causal work; lengths the axis does not divide are refused in one line."""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import jax
import numpy as np
import pytest

from relpos_jax import sharding
from relpos_jax.attention import context
from relpos_jax.config import ConfigError

WORKER = pathlib.Path(__file__).resolve().parent / "context_worker.py"
HALVES = (
    "txl+same_length+clamp,shaw,t5,alibi,rope,deberta",
    "txl,sinusoid,learned,none,fire,kerple",
)


def run_worker(*args) -> dict:
    env = {
        **os.environ,
        "XLA_FLAGS": f"{os.environ.get('XLA_FLAGS', '')} --xla_force_host_platform_device_count=8",
        "JAX_PLATFORMS": "cpu",
    }
    done = subprocess.run(
        [sys.executable, str(WORKER), *map(str, args)],
        env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("variants", HALVES)
def test_every_scheme_on_context_blocks_equals_one_device(variants):
    result = run_worker("schemes", variants)
    assert sorted(result) == sorted(variants.split(","))
    for variant, by_blocks in result.items():
        assert sorted(by_blocks) == ["2", "4", "8"], variant
        for blocks, diff in by_blocks.items():
            where = f"{variant} on {blocks} context devices: {diff}"
            assert diff["logits"] <= 1e-5 and diff["loss"] <= 1e-5, where
            assert diff["grads"] <= 1e-5, where  # relative to the largest gradient entry


@pytest.mark.slow
def test_data_context_tensor_mesh_trains_like_one_device(tmp_path):
    result = run_worker("train", tmp_path)
    assert len(result["one"]) == len(result["split"]) == 10
    np.testing.assert_allclose(result["split"], result["one"], atol=1e-4, rtol=0)
    assert result["valid_split"] == pytest.approx(result["valid_one"], abs=1e-4)
    assert result["memory_spec"] == "P(None, ('data', 'fsdp'), 'context', None)"
    assert result["generated_equal"]  # one-token steps do not split: whole on every device
    assert len(result["dropatt_losses"]) == 3 and np.isfinite(result["dropatt_losses"]).all()
    assert np.isfinite(result["dropatt_valid"])


def test_zigzag_gives_every_device_the_same_causal_work():
    length, devices = 64, 4
    order = context.zigzag(length, devices)
    assert sorted(order.tolist()) == list(range(length))
    work = [int((order[b] + 1).sum()) for b in np.split(np.arange(length), devices)]
    assert len(set(work)) == 1  # keys each device's queries may see (causal, no memory)
    contiguous = [int((b + 1).sum()) for b in np.split(np.arange(length), devices)]
    assert max(contiguous) > 3 * min(contiguous)
    assert context.zigzag(12, 4) is None  # 2c does not divide 12: contiguous blocks


def test_query_tiles_never_straddle_two_chunks():
    assert context._query_tile(512, 6) == 6
    assert context._query_tile(4, 6) == 3
    assert context._query_tile(None, 8) == 8


def abstract_mesh(blocks: int):
    return jax.sharding.AbstractMesh((1, 1, blocks, 1), sharding.AXES)


@pytest.mark.parametrize(
    ("impl", "lengths", "message"),
    [
        ("tiled", {"segment_len": 12, "mem_len": 8}, "mesh.context=8 is invalid; it must divide segment_len=12"),
        ("tiled", {"segment_len": 16, "mem_len": 12}, "it must divide mem_len=12"),
        ("dense", {"segment_len": 16, "mem_len": 8}, "needs --config.model.attention_impl=tiled"),
    ],
)  # fmt: skip
def test_a_context_axis_that_does_not_split_the_lengths_is_refused(impl, lengths, message):
    with pytest.raises(ConfigError, match=message) as error:
        sharding.check_context(abstract_mesh(8), impl, **lengths)
    assert "\n" not in str(error.value)
    sharding.check_context(abstract_mesh(8), "tiled", segment_len=16, mem_len=8)
    sharding.check_context(abstract_mesh(1), "dense", segment_len=3, mem_len=5)
