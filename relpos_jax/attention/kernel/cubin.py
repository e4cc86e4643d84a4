"""The Triton kernels compiled to an NVIDIA GPU's machine code on a host without one: what each
needs of the chip (shared memory, registers, spilled bytes) and whether Triton's software pipeliner
moved a read of ``skew``'s scratch buffer ahead of the store it must see.

Pallas lowers a kernel to Triton's IR in JAX (``jax.export`` for ``cuda`` runs it without a GPU);
the ``triton`` wheel (the ``cubin`` extra) compiles that IR, re-read as text, for a chosen
architecture with its own ``ptxas``. Lowering alone checks none of the above: it is the compile
that allocates shared memory, pipelines loads and spills registers.

``skew`` reads its scratch buffer with volatile loads, and nothing else does: a volatile load that
became an asynchronous copy (``ttg.async_copy_global_to_local … isVolatile``) is such a read issued
before its store (for the next tile, or for the first one before any store).
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import subprocess
import tempfile
import time

import jax

from relpos_jax.ops import backend

SPILL_BUDGET = 2048  # bytes a thread may spill before a kernel counts as register-bound


@dataclasses.dataclass(frozen=True)
class Lowered:
    """One ``pallas_call`` as Pallas lowers it for Triton: its IR and its launch parameters."""

    name: str
    ir: str
    num_warps: int
    num_stages: int


@dataclasses.dataclass(frozen=True)
class Compiled:
    """What one kernel needs of the chip it was compiled for."""

    name: str
    arch: int
    num_warps: int
    num_stages: int
    shared: int  # bytes of shared memory a block
    registers: int  # a thread
    spilled: int  # bytes a thread stores to local memory
    early_reads: int  # scratch reads the pipeliner issued ahead of their store
    seconds: float

    def problems(self) -> list[str]:
        """Why this kernel would not run as it should on its chip (empty: it would)."""
        out, capacity = [], backend.gpu_shared_memory(self.arch)
        if self.shared > capacity:
            out.append(f"shared memory {self.shared:,} B > {capacity:,} B")
        if self.spilled > SPILL_BUDGET:
            out.append(f"spills {self.spilled:,} B a thread > {SPILL_BUDGET:,} B")
        if self.early_reads:
            out.append(f"{self.early_reads} scratch reads pipelined ahead of their store")
        return out


def lower(fn, *args) -> list[Lowered]:
    """The Triton kernels of ``jax.jit(fn)(*args)`` (shapes will do), in the order they run."""
    from jax._src.pallas.triton import lowering  # the hook into Pallas' Triton lowering

    modules = []
    original = lowering.lower_jaxpr_to_triton_module

    def keep(*a, **k):
        result = original(*a, **k)
        modules.append(result.module.operation.get_asm(enable_debug_info=False))
        return result

    lowering.lower_jaxpr_to_triton_module = keep
    try:
        text = jax.export.export(
            jax.jit(fn),
            platforms=["cuda"],
            disabled_checks=[jax.export.DisabledSafetyCheck.custom_call("__gpu$xla.gpu.triton")],
        )(*args).mlir_module()
    finally:
        lowering.lower_jaxpr_to_triton_module = original
    calls = re.findall(r'name = "([^"]*)", num_stages = (\d+) : i32, num_warps = (\d+) : i32', text)
    if len(calls) != len(modules):
        raise RuntimeError(f"cubin: {len(modules)} Triton modules but {len(calls)} launches")
    return [
        Lowered(name, ir, int(warps), int(stages))
        for ir, (name, stages, warps) in zip(modules, calls, strict=True)
    ]


def compile_kernel(kernel: Lowered, arch: int = 90, num_warps=None, num_stages=None) -> Compiled:
    """``kernel`` compiled to a cubin for compute capability ``arch`` (its own launch parameters
    unless given)."""
    try:
        import triton
        from triton.backends.compiler import GPUTarget
    except ImportError as error:
        raise RuntimeError("cubin: needs the triton wheel (pip install -e '.[cubin]')") from error
    os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")
    warps = num_warps or kernel.num_warps
    stages = num_stages or kernel.num_stages
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, f"{kernel.name}.ttir")
        with open(path, "w") as f:
            f.write(kernel.ir)
        with _quiet_cache(folder):
            out = triton.compile(
                path,
                target=GPUTarget("cuda", arch, 32),
                options={"num_warps": warps, "num_stages": stages},
            )
        registers, spilled = _ptxas_usage(out.asm["ptx"], arch, folder)
    early = len(re.findall(r"async_copy_global_to_local[^\n]*isVolatile", out.asm["ttgir"]))
    return Compiled(kernel.name, arch, warps, stages, int(out.metadata.shared), registers, spilled,
                    early, time.perf_counter() - start)  # fmt: skip


@contextlib.contextmanager
def _quiet_cache(folder: str):
    """Triton's cache in ``folder`` (a compile of this module is never reused across calls)."""
    before = os.environ.get("TRITON_CACHE_DIR")
    os.environ["TRITON_CACHE_DIR"] = os.path.join(folder, "cache")
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("TRITON_CACHE_DIR", None)
        else:
            os.environ["TRITON_CACHE_DIR"] = before


def _ptxas_usage(ptx: str, arch: int, folder: str) -> tuple[int, int]:
    """``(registers, spilled bytes)`` a thread, from the wheel's ``ptxas -v``."""
    from triton.backends.nvidia.compiler import get_ptxas

    path = os.path.join(folder, "kernel.ptx")
    with open(path, "w") as f:
        f.write(ptx)
    gpu = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"
    log = subprocess.run(
        [get_ptxas(arch).path, "-v", f"--gpu-name={gpu}", path, "-o", os.devnull],
        capture_output=True, text=True, check=True,
    ).stderr  # fmt: skip
    registers = max(map(int, re.findall(r"Used (\d+) registers", log)), default=0)
    spilled = sum(map(int, re.findall(r"(\d+) bytes spill stores", log)))
    return registers, spilled


# the kernels' term sets, by the schemes that use them (``kernel.attend``'s tables)
TERMS = {
    "rope": (),  # content only: RoPE, absolute encodings, none
    "txl": ("band",),
    "shaw": ("band", "values"),
    "t5": ("bias",),  # T5, ALiBi, KERPLE
    "fire": ("tile",),  # a term evaluated in each tile: FIRE's
}


def attention_step(terms: tuple[str, ...], head_dim: int, dtype, backend: str = "triton",
                   block: int | None = None, batch: int = 1, queries: int = 512, memory: int = 512,
                   heads: int = 2, **options):  # fmt: skip
    """``(fn, shapes)``: the loss of ``kernel.attend`` with these terms (``TERMS``' values) and its
    gradients, which run the forward and the backward kernel, and the shapes of its arguments."""
    import jax.numpy as jnp

    from relpos_jax.attention import kernel

    keys = memory + queries

    from relpos_jax.schemes.fire import FireTile  # the tile term measured: FIRE's, 32 units

    def loss_and_grads(q, k, v, a, logit_rows, bias_rows, value_rows, tile_rows):
        tables = {
            "a": a if "band" in terms else None,
            "logit_rows": logit_rows if "band" in terms else None,
            "bias_rows": bias_rows if "bias" in terms else None,
            "value_rows": value_rows if "values" in terms else None,
            "tile_rows": tile_rows if "tile" in terms else None,
        }
        tile = FireTile(32) if "tile" in terms else None

        def loss(q, k, v, tables):
            out = kernel.attend(q, k, v, kernel.Terms(**tables, tile=tile),
                                key_valid=jnp.ones(keys, bool), scale=head_dim**-0.5,
                                backend=backend, block=block, **options)  # fmt: skip
            return out.astype(jnp.float32).sum()

        return jax.value_and_grad(loss, argnums=(0, 1, 2, 3))(q, k, v, tables)

    shape = lambda *s, dtype=dtype: jax.ShapeDtypeStruct(s, dtype)  # noqa: E731
    f32 = jnp.float32
    shapes = (
        shape(batch, queries, heads, head_dim), shape(batch, keys, heads, head_dim),
        shape(batch, keys, heads, head_dim), shape(batch, queries, heads, head_dim),
        shape(heads, keys, head_dim, dtype=f32), shape(heads, keys, dtype=f32),
        shape(1, keys, head_dim, dtype=f32), shape(heads, 1, 128, dtype=f32),
    )  # fmt: skip
    return loss_and_grads, shapes


def attention(scheme: str, head_dim: int, dtype, block: int | None = None, **options):
    """The forward and backward Triton kernels of ``kernel.attend`` with ``scheme``'s terms."""
    fn, shapes = attention_step(TERMS[scheme], head_dim, dtype, block=block, **options)
    return lower(fn, *shapes)
