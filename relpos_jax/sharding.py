"""Device mesh, logical axis rules and the shardings of parameters, optimizer state and batches.

The mesh has four axes: ``data`` (batch rows), ``fsdp`` (batch rows, and parameters split along
their model dimension), ``context`` (the segment and the memory split into contiguous blocks:
context parallelism, ``attention.context``), ``tensor`` (heads and the feed-forward dimension).
Every parameter names its
dimensions by logical axes (``embed``, ``heads``, ``head_dim``, ``mlp``, ``vocab``, …) where it is
created (its ``axes`` metadata: the model, the attention, each scheme's own parameters); ``RULES``
maps each logical axis to mesh axes, and can be overridden. Batches and the segment memory are split over the batch
axes. Axis sizes of -1 take the devices left; a mesh that does not fit the devices fails with one line.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Mapping, Sequence
from typing import Any

import jax
import numpy as np
from flax import nnx
from jax.sharding import AxisType, NamedSharding

from relpos_jax.config import MeshConfig, fail

AXES = ("data", "fsdp", "context", "tensor")
BATCH = ("data", "fsdp")
CONTEXT = "context"

# logical axis -> mesh axis (or axes, or None: replicated)
RULES: dict[str, Any] = {
    "batch": BATCH,
    "embed": "fsdp",
    "heads": "tensor",
    "head_dim": None,
    "mlp": "tensor",
    "vocab": None,
    "length": None,
    "layers": None,
    "rows": None,  # rows of relative-position tables
}


def mesh_shape(cfg: MeshConfig, device_count: int) -> tuple[int, int, int, int]:
    """The axis sizes in ``AXES`` order (data, fsdp, context, tensor)."""
    sizes = [getattr(cfg, axis) for axis in AXES]
    free = [i for i, s in enumerate(sizes) if s == -1]
    if len(free) > 1:
        fail("mesh", tuple(sizes), "at most one axis may be -1")
    fixed = math.prod(s for s in sizes if s != -1)
    if free:
        if device_count % fixed:
            fail(
                f"mesh.{AXES[free[0]]}",
                -1,
                f"the other axes ({fixed} devices) do not divide the {device_count} devices",
            )
        sizes[free[0]] = device_count // fixed
    if math.prod(sizes) != device_count:
        fail(
            "mesh",
            tuple(sizes),
            f"data·fsdp·context·tensor = {math.prod(sizes)} must equal the {device_count} devices",
        )
    return tuple(sizes)


def make_mesh(cfg: MeshConfig, devices: Sequence[Any] | None = None) -> jax.sharding.Mesh:
    devices = list(devices if devices is not None else jax.devices())
    shape = mesh_shape(cfg, len(devices))
    return jax.make_mesh(shape, AXES, axis_types=(AxisType.Auto,) * len(AXES), devices=devices)


def logical_spec(axes: Sequence[str | None], rules: Mapping[str, Any] = RULES) -> jax.P:
    return jax.P(*(rules.get(a) if a is not None else None for a in axes))


def param_axes(variable: Any) -> tuple[str | None, ...]:
    """The logical axes a parameter (or an optimizer moment, which inherits its parameter's
    metadata) was created with: ``axes`` metadata, set where the model or a scheme creates it;
    replicated if it has none (norms, scalars)."""
    shape = getattr(variable, "shape", ())
    return getattr(variable, "axes", None) or (None,) * len(shape)


def path_string(path) -> str:
    """A pytree path as "a/b/c", without the trailing "value" of an NNX Variable."""
    names = [str(getattr(k, "key", getattr(k, "name", getattr(k, "idx", k)))) for k in path]
    return "/".join(names[:-1] if names and names[-1] == "value" else names)  # NNX Variable leaves


def _fits(spec: jax.P, shape, mesh) -> jax.P:
    """Drop mesh axes that do not divide a dimension (e.g. 2 heads on 4 tensor devices)."""
    out = []
    for dim, axes in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec)), strict=False):
        names = (axes,) if isinstance(axes, str) else tuple(axes or ())
        size = math.prod(mesh.shape[n] for n in names)
        out.append(axes if names and dim % size == 0 else None)
    return jax.P(*out)


def state_shardings(state: Any, mesh: jax.sharding.Mesh, rules: Mapping[str, Any] = RULES) -> Any:
    """A NamedSharding for every variable of a (model, optimizer) state by its logical axes."""

    def one(variable):
        if not isinstance(variable, nnx.Variable):  # a bare array: replicated
            return NamedSharding(mesh, jax.P())
        spec = logical_spec(param_axes(variable), rules)
        return variable.replace(NamedSharding(mesh, _fits(spec, variable.shape, mesh)))

    return jax.tree.map(one, state, is_leaf=lambda x: isinstance(x, nnx.Variable))


def batch_sharding(mesh: jax.sharding.Mesh) -> NamedSharding:
    """Batches ``[B, T]``: rows over the batch axes, the segment in blocks over ``context``."""
    return NamedSharding(mesh, jax.P(BATCH, CONTEXT))


def segments_sharding(mesh: jax.sharding.Mesh) -> NamedSharding:
    """Blocks of consecutive segments ``[S, B, T]``: each segment split like a batch."""
    return NamedSharding(mesh, jax.P(None, BATCH, CONTEXT))


def memory_sharding(mesh: jax.sharding.Mesh, *, keys_values: bool = False):
    """The memory split like the batch, its slots in blocks over ``context``: ``Memory
    [L, B, M, D]`` or ``KeyValueMemory`` (keys and values ``[L, B, N, H, M]``)."""
    from relpos_jax.memory import KeyValueMemory, Memory

    if keys_values:
        rows = NamedSharding(mesh, jax.P(None, BATCH, None, None, CONTEXT))
        return KeyValueMemory(rows, rows, NamedSharding(mesh, jax.P()))
    return Memory(
        NamedSharding(mesh, jax.P(None, BATCH, CONTEXT, None)), NamedSharding(mesh, jax.P())
    )


def check_context(mesh: jax.sharding.Mesh, attention_impl: str, **lengths: int) -> None:
    """A ``context`` axis needs the tiled attention and must divide every length it splits
    (``segment_len=…``, ``mem_len=…``): one line naming the numbers."""
    blocks = mesh.shape[CONTEXT]
    if blocks == 1:
        return
    if attention_impl == "dense":  # (auto and kernel run the tiled path on a split segment)
        fail(
            "mesh.context", blocks, "context parallelism needs --config.model.attention_impl=tiled"
        )
    for name, length in lengths.items():
        if length % blocks:
            fail(
                "mesh.context",
                blocks,
                f"it must divide {name}={length} (the blocks the devices hold)",
            )


def under_mesh(mesh: jax.sharding.Mesh, fn):
    """``fn`` traced with ``mesh`` as the abstract mesh, where the model reads its ``context``
    axis (``attention.context.blocks``); for ``jax.jit``."""

    @functools.wraps(fn)
    def traced(*args, **kwargs):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
            return fn(*args, **kwargs)

    return traced


def replicated(mesh: jax.sharding.Mesh) -> NamedSharding:
    return NamedSharding(mesh, jax.P())


def check_batch(batch_size: int, mesh: jax.sharding.Mesh, process_count: int) -> None:
    """The batch's rows must split evenly over the batch axes (no row padded: the optimisation is
    the config's); else one line with the batch sizes that would, and the mesh that keeps it."""
    rows = mesh.shape["data"] * mesh.shape["fsdp"]
    if batch_size % rows:
        below, above = batch_size // rows * rows, (batch_size // rows + 1) * rows
        sizes = f"{below} or {above}" if below else f"{above}"
        per_rest = mesh.size // mesh.shape[CONTEXT]  # devices for data·fsdp·tensor
        keeps = max(d for d in range(1, rows + 1) if batch_size % d == 0 and per_rest % d == 0)
        fail(
            "data.batch_size",
            batch_size,
            f"it must be a multiple of data·fsdp = {rows} mesh devices: use {sizes}, or keep "
            f"{batch_size} with --config.mesh.data={keeps} --config.mesh.fsdp=1 "
            f"--config.mesh.tensor={per_rest // keeps} (the heads split over tensor)",
        )
    if batch_size % process_count:
        fail(
            "data.batch_size", batch_size, f"it must be a multiple of the {process_count} processes"
        )


def global_batch(local: dict[str, np.ndarray], mesh: jax.sharding.Mesh) -> dict[str, jax.Array]:
    """Each process's rows -> one global array per key, split over the batch axes."""
    sharding = batch_sharding(mesh)
    return {k: jax.make_array_from_process_local_data(sharding, v) for k, v in local.items()}
