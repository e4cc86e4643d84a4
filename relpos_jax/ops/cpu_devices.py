"""On a CPU, one JAX device per core, so that the batch is split over the cores.

XLA:CPU runs much of a step on one thread: every batched matrix product (attention's products, one
per batch row and head, measured at 1.0 cores busy), and the copies and elementwise fusions between
products; only large plain products use its intra-op threads. With as many CPU devices as cores, the
mesh's ``data`` axis (``mesh.data = -1``, the default) spans them and each core runs its rows of the
batch, the gradients summed across them as on any data-parallel mesh: on 2 cores a txl_small bfloat16
training step takes 10–25% less time and evaluation 20–30% less on Sapphire Rapids, ~6% and ~8%
less on Zen 4 (docs/benchmarks/README.md).

``one_device_per_core(batch_sizes, mesh)`` is called by ``train.py``, ``eval.py`` and the benchmarks
before JAX starts. It picks the largest device count, at most the cores this process may run on, for
which ``mesh`` fits and every batch size divides the mesh's batch axes. It changes nothing when the
count is already chosen (``JAX_NUM_CPU_DEVICES``, or ``--xla_force_host_platform_device_count`` in
``XLA_FLAGS``) or when JAX has already started; ``JAX_NUM_CPU_DEVICES=1`` keeps one device. On a
GPU or TPU host it only sets how many CPU devices exist: the mesh is built from the accelerators.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from relpos_jax import sharding
from relpos_jax.config import ConfigError, MeshConfig


def cores() -> int:
    """The cores this process may run on (its CPU affinity where the OS reports one)."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def device_count_for(batch_sizes: Sequence[int], mesh: MeshConfig, cores: int) -> int:
    """The largest count ≤ ``cores`` of devices that ``mesh`` fits and whose batch axes
    (data·fsdp) divide every batch size; 1 if there is none."""
    for count in range(cores, 1, -1):
        try:
            data, fsdp, *_ = sharding.mesh_shape(mesh, count)
        except ConfigError:
            continue
        if all(size % (data * fsdp) == 0 for size in batch_sizes):
            return count
    return 1


def chosen_by_environment() -> bool:
    return "JAX_NUM_CPU_DEVICES" in os.environ or "xla_force_host_platform_device_count" in (
        os.environ.get("XLA_FLAGS", "")
    )


def one_device_per_core(batch_sizes: Sequence[int], mesh: MeshConfig | None = None) -> int | None:
    """Sets ``jax_num_cpu_devices`` to ``device_count_for(...)``; returns it, or None where the
    environment chose the count or JAX has already started (nothing changed)."""
    import jax

    if chosen_by_environment():
        return None
    count = device_count_for(batch_sizes, mesh or MeshConfig(), cores())
    try:
        jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError:  # backends already initialised: their devices stay as they are
        return None
    return count
