"""Ahead-of-time compilation for a TPU slice without the hardware: a config's training and
evaluation steps compiled by the real TPU compiler (Mosaic kernels included) for abstract devices.

With libtpu installed (``pip install -e '.[tpu]'``), ``jax.experimental.topologies`` describes any
slice (``v5p:4x4x4``) on any host; the steps are traced for the TPU (``ops.backend.target``: the
kernel variant and the product layouts follow the slice's chips, not this host's), sharded over the
config's mesh of its devices, and compiled. ``Program`` holds what the compiler reports: a chip's
memory (arguments, outputs, temporaries, code), FLOPs a chip and the compile time.
``python -m bench.aot`` prints them and says in one line which fields make a step fit.

Legend: B batch rows, T segment, S segments an evaluation call scores.
"""

from __future__ import annotations

import dataclasses
import functools
import os
import re
import time
from collections.abc import Sequence
from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from relpos_jax import evaluate, sharding
from relpos_jax.config import Config, fail
from relpos_jax.errors import accelerator_error
from relpos_jax.memory import init_mems
from relpos_jax.model import TransformerLM
from relpos_jax.ops import backend as ops_backend
from relpos_jax.train_step import build, jitted_train_step

GIB = 2**30
# HBM a chip, by device kind (Google Cloud's TPU pages)
HBM_GIB = {"TPU v4": 32, "TPU v5 lite": 16, "TPU v5": 95, "TPU v6 lite": 32}
MEGACORE = ("v4", "v5p")  # two TensorCores a chip


def topology(name: str) -> list[Any]:
    """The abstract devices of a TPU slice, ``"v5e:2x2"``, ``"v5p:2x2x2"``, ``"v4:2x2x1"``
    (generation and chips along each axis; libtpu knows which exist)."""
    # compiling needs no chip: let several processes (pytest's workers, a training run on a TPU
    # VM) load libtpu at once, which its lockfile otherwise refuses
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    try:
        from jax.experimental import topologies

        # one device a chip (both TensorCores of a v4 or v5p as one, as a TPU VM has them)
        megacore = {"chip_config_name": "megacore"} if name.split(":")[0] in MEGACORE else {}
        return list(
            topologies.get_topology_desc(platform="tpu", topology_name=name, **megacore).devices
        )
    except Exception as error:  # no libtpu, or a slice that does not exist
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        fail("--topology", name, f"{reason[:200]} (libtpu: pip install -e '.[tpu]')")


def hbm_bytes(devices: Sequence[Any]) -> int | None:
    """A chip's HBM in bytes, from its device kind (None: a kind not in ``HBM_GIB``)."""
    gib = HBM_GIB.get(devices[0].device_kind)
    return None if gib is None else gib * GIB


def hosts(devices: Sequence[Any]) -> int:
    """The processes (hosts) of a slice: each loads its share of the batch."""
    return len({device.process_index for device in devices})


@dataclasses.dataclass(frozen=True)
class Program:
    """One compiled step: per chip, its memory in bytes and FLOPs; the compile time in seconds."""

    name: str
    compile_s: float
    argument_bytes: int
    output_bytes: int
    alias_bytes: int  # outputs that reuse a donated argument's buffer
    temp_bytes: int
    code_bytes: int
    flops: float  # the compiler's count a chip; a loop body (the scanned layers) counts once
    kernel_calls: int = 0  # Mosaic kernels (Pallas calls) in the program

    @property
    def chip_bytes(self) -> int:
        """What a chip holds at the step's peak: arguments, outputs not aliased, temporaries, code."""
        return (
            self.argument_bytes + self.output_bytes - self.alias_bytes + self.temp_bytes
            + self.code_bytes
        )  # fmt: skip

    @classmethod
    def of(cls, name: str, compiled: Any, seconds: float) -> Program:
        memory = compiled.memory_analysis()
        cost = compiled.cost_analysis()
        cost = cost[0] if isinstance(cost, list) else cost
        return cls(
            name, seconds, memory.argument_size_in_bytes, memory.output_size_in_bytes,
            memory.alias_size_in_bytes, memory.temp_size_in_bytes,
            memory.generated_code_size_in_bytes, float((cost or {}).get("flops", 0.0)),
            compiled.as_text().count('custom_call_target="tpu_custom_call"'),
        )  # fmt: skip


def _abstract(tree: Any, shardings: Any) -> Any:
    """Shapes and dtypes of ``tree`` with the shardings of ``shardings`` (same structure)."""
    return jax.tree.map(
        lambda x, s: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=s), tree, shardings
    )


class DoesNotFit(RuntimeError):
    """The compiler found that a step needs more than a chip's HBM (``needs_bytes``, its estimate)."""

    def __init__(self, name: str, needs_bytes: int, detail: str):
        super().__init__(f"the {name} needs {needs_bytes / GIB:.1f} GiB a chip")
        self.name, self.needs_bytes, self.detail = name, needs_bytes, detail


def _compile(name: str, lowered_by, cfg: Config) -> Program:
    """``lowered_by().compile()`` as a ``Program``; a step that does not fit raises ``DoesNotFit``,
    a kernel that does not compile ``errors.AcceleratorError`` (one line)."""
    start = time.perf_counter()
    try:
        compiled = lowered_by().compile()
    except jax.errors.JaxRuntimeError as error:
        text = str(error)
        if "RESOURCE_EXHAUSTED" in text and (size := re.search(r"\((\d+(?:\.\d+)?)G\)", text)):
            raise DoesNotFit(name, int(float(size.group(1)) * GIB), text) from None
        raise accelerator_error(error, cfg) or error from None
    return Program.of(name, compiled, time.perf_counter() - start)


def _checked_mesh(cfg: Config, devices: Sequence[Any]) -> jax.sharding.Mesh:
    mesh = sharding.make_mesh(cfg.mesh, devices)
    sharding.check_batch(cfg.data.batch_size, mesh, hosts(devices))
    sharding.check_context(
        mesh, cfg.model.attention_impl, segment_len=cfg.data.segment_len,
        mem_len=cfg.model.mem_len,
    )  # fmt: skip
    return mesh


def train_step(config: Any, devices: Sequence[Any]) -> Program:
    """The training step of ``config`` (``train_step.train_step_fn``: forward, backward, optimizer,
    memory carried) compiled for ``devices``, sharded as ``train.py`` shards it."""
    cfg = Config.from_any(config)
    mesh = _checked_mesh(cfg, devices)
    with ops_backend.target(devices[0].platform, devices[0].device_kind):
        graphdef, state = nnx.split(nnx.eval_shape(functools.partial(build, cfg)))
        shardings = sharding.state_shardings(state, mesh)
        leaves, treedef = jax.tree.flatten(shardings)
        step = jitted_train_step(
            graphdef, cfg.train.grad_accum, (treedef, tuple(leaves)), mesh, cfg.train.loss_from
        )
        m, rows, length = cfg.model, cfg.data.batch_size, cfg.data.segment_len
        tokens = jax.ShapeDtypeStruct(
            (rows, length), jnp.int32, sharding=sharding.batch_sharding(mesh)
        )
        mems = jax.eval_shape(lambda: init_mems(m.n_layers, rows, m.mem_len, m.d_model, m.dtype))
        args = (
            _abstract(state, shardings),
            {"inputs": tokens, "targets": tokens},
            _abstract(mems, sharding.memory_sharding(mesh)),
        )
        return _compile("train step", lambda: step.lower(*args), cfg)


def eval_step(config: Any, devices: Sequence[Any]) -> Program:
    """The evaluation call of ``config`` (``evaluate.score_segments``: ``segments_per_call``
    segments of ``eval.*``, keys and values kept as memory) compiled for ``devices``."""
    cfg = Config.from_any(config)
    mesh = _checked_mesh(cfg, devices)
    settings = evaluate.EvalSettings.of(cfg)
    with ops_backend.target(devices[0].platform, devices[0].device_kind):
        model = nnx.eval_shape(
            lambda: TransformerLM(settings.model_config(cfg.model), rngs=nnx.Rngs(0))
        )
        graphdef, state = nnx.split(model)
        rows = settings.batch_size
        split = rows % (mesh.shape["data"] * mesh.shape["fsdp"]) == 0  # else replicated
        per_call = evaluate.segments_per_call(rows * settings.segment_len)
        shape = (per_call, rows, settings.segment_len)
        segments = sharding.segments_sharding(mesh) if split else sharding.replicated(mesh)
        block = {  # as ``evaluate._placed`` places them
            "inputs": jax.ShapeDtypeStruct(shape, jnp.int32, sharding=segments),
            "targets": jax.ShapeDtypeStruct(shape, jnp.int32, sharding=segments),
            "weights": jax.ShapeDtypeStruct(shape, jnp.float32, sharding=segments),
        }
        mems = jax.eval_shape(lambda: model.init_mems(rows, settings.mem_len, keys_values=True))
        if split:
            mems = _abstract(mems, sharding.memory_sharding(mesh, keys_values=True))
        else:
            mems = _abstract(mems, jax.tree.map(lambda _: sharding.replicated(mesh), mems))
        state = _abstract(state, sharding.state_shardings(state, mesh))
        with jax.set_mesh(mesh):
            lowered = lambda: evaluate.score_segments.lower(graphdef, state, block, mems)  # noqa: E731
            return _compile("eval step", lowered, cfg)


def smaller(config: Any, devices: Sequence[Any]) -> list[dict[str, Any]]:
    """Changes that make the training step hold less a chip, each on top of the one before and
    none changing the optimisation: remat (each layer's activations recomputed in the backward),
    the parameters and optimizer state split over the batch devices (``fsdp``), the batch as
    micro-batches (``grad_accum``, where they still split over those devices)."""
    cfg = Config.from_any(config)
    mesh = sharding.mesh_shape(cfg.mesh, len(devices))
    batch_devices = mesh[0] * mesh[1]
    changes = [{"model.remat": True}]
    if mesh[0] > 1:
        changes.append({**changes[-1], "mesh.data": 1, "mesh.fsdp": batch_devices})
    accum = cfg.train.grad_accum
    for _ in range(2):
        accum *= 2
        if cfg.data.batch_size % (accum * batch_devices) == 0:
            changes.append({**changes[-1], "train.grad_accum": accum})
    return changes


def fit(config: Any, devices: Sequence[Any], compile_step, say=print):
    """The first of ``smaller``'s changes under which ``compile_step(config, devices)`` fits a
    chip's HBM, with its ``Program``; None if none does."""
    budget = hbm_bytes(devices)
    for change in smaller(config, devices):
        changed = config.copy_and_resolve_references()
        for field, value in change.items():
            section, name = field.split(".")
            changed[section][name] = value
        say(f"  trying {overrides(change)} …")
        try:
            program = compile_step(changed, devices)
        except DoesNotFit:
            continue
        if budget is None or program.chip_bytes <= budget:
            return change, program
    return None


def overrides(change: dict[str, Any]) -> str:
    """``{"model.remat": True}`` as the flags that set it: ``--config.model.remat=True``."""
    return " ".join(f"--config.{field}={value}" for field, value in change.items())
