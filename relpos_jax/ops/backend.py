"""The platform the model's program is built for, so that what only helps XLA:CPU stays on a CPU.

On a CPU the model lays out its products for XLA:CPU's kernels (``precision._product``), keeps keys
and values ``[B, N, H, K]`` (``Scheme.kv_layout``), draws dropout from a hash that XLA fuses
(``dropout``), and sets the host's allocator (``host_memory``). On a GPU or TPU it is plain
``jnp.einsum`` with float32 accumulation, ``[B, T, N, H]`` keys and values, and JAX's own dropout.

``platform()`` is the default backend's, unless ``target(...)`` names another: a program traced on a
CPU host for a GPU or TPU (``jax.export``, an ahead-of-time compile) is then the accelerator's.
``device_kind()``, ``tpu_generation()``, ``tpu_vmem_bytes()`` and ``gpu_shared_memory()`` tell which
chip (``"TPU v5 lite"``: 5, 128 MiB of VMEM; ``"NVIDIA H200"``: 227 KiB of shared memory a block),
for what differs between generations (Mosaic's strided rotation, from v5 on; how much VMEM or shared
memory the kernels may take).
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.util
import os
import re
from collections.abc import Iterator

import jax

_TARGET: contextvars.ContextVar[tuple[str, str | None] | None] = contextvars.ContextVar(
    "target", default=None
)
_ALIASES = {"cuda": "gpu", "rocm": "gpu"}


def platform() -> str:
    """``"cpu"``, ``"gpu"`` or ``"tpu"``: the target set by ``target``, else JAX's default backend."""
    target_ = _TARGET.get()
    name = target_[0] if target_ else jax.default_backend()
    return _ALIASES.get(name, name)


def on_cpu() -> bool:
    return platform() == "cpu"


def device_kind() -> str | None:
    """The target's device kind (``"TPU v5 lite"``, ``"NVIDIA H200"``): the one ``target`` names,
    else that of JAX's first device when it is of the target platform; None if unknown."""
    target_ = _TARGET.get()
    if target_ is not None:
        return target_[1]
    return jax.devices()[0].device_kind


def tpu_generation() -> int | None:
    """The TPU's generation (``"TPU v4"``: 4, ``"TPU v5 lite"``: 5, ``"TPU7x"``: 7); None off a TPU
    or when the kind is unknown."""
    if platform() != "tpu":
        return None
    found = re.search(r"TPU\s*v?(\d+)", device_kind() or "")
    return int(found.group(1)) if found else None


# VMEM a TensorCore, MiB, by TPU (jax.experimental.pallas.tpu.get_tpu_info_for_chip, jax 0.10.2)
_TPU_VMEM_MIB = (("v5 lite", 128), ("v5e", 128), ("v6 lite", 128), ("v6e", 128), ("v5", 64),
                 ("v4", 16), ("7", 64))  # fmt: skip


def tpu_vmem_bytes() -> int | None:
    """VMEM of one TensorCore of the target TPU; None off a TPU or when the kind is unknown."""
    if platform() != "tpu":
        return None
    kind = (device_kind() or "").lower()
    for name, mib in _TPU_VMEM_MIB:
        if name in kind:
            return mib << 20
    return None


# compute capability of a GPU by its device kind, for a target named without a device (the one a
# kind's name does not tell: 9.0, Hopper, what Pallas compiles for without a GPU)
_GPU_CAPABILITY = (("h100", 90), ("h200", 90), ("h800", 90), ("gh200", 90), ("b200", 100),
                   ("gb200", 100), ("b300", 100), ("a100", 80), ("a800", 80), ("a30", 80),
                   ("rtx", 86), ("a10", 86), ("a40", 86), ("l4", 89), ("l40", 89))  # fmt: skip
# shared memory a block may take (CUDA's opt-in maximum), bytes, by compute capability
GPU_SHARED_MEMORY = {70: 98_304, 75: 65_536, 80: 166_912, 86: 101_376, 87: 166_912, 89: 101_376,
                      90: 232_448, 100: 232_448, 103: 232_448, 120: 101_376}  # fmt: skip


def gpu_capability() -> int | None:
    """The target GPU's compute capability (``90`` for 9.0); None off a GPU. From the device where
    one is there, else from the device kind a target names, else 90."""
    if platform() != "gpu":
        return None
    device = jax.devices()[0]
    if _TARGET.get() is None and device.platform == "gpu":
        major, _, minor = str(getattr(device, "compute_capability", "9.0")).partition(".")
        return int(major) * 10 + int(minor or 0)
    kind = (device_kind() or "").lower()
    return next((cc for name, cc in _GPU_CAPABILITY if name in kind), 90)


def gpu_shared_memory(capability: int | None = None) -> int | None:
    """Shared memory one block may take on a GPU of ``capability`` (default: the target's), bytes
    (227 KiB on an H100 or H200, 163 KiB on an A100, 99 KiB on consumer parts); None off a GPU."""
    capability = capability or gpu_capability()
    if capability is None:
        return None
    known = [cc for cc in GPU_SHARED_MEMORY if cc <= capability]
    return GPU_SHARED_MEMORY[max(known)] if known else min(GPU_SHARED_MEMORY.values())


@contextlib.contextmanager
def target(name: str, device_kind: str | None = None) -> Iterator[None]:
    """Build models and trace programs for platform ``name`` (``cpu``, ``gpu``/``cuda``, ``tpu``),
    its chips of ``device_kind`` (a device's ``device_kind``; None: unknown) inside this block,
    whatever this host's devices are."""
    token = _TARGET.set((name, device_kind))
    try:
        yield
    finally:
        _TARGET.reset(token)


def cpu_only_host() -> bool:
    """Whether JAX will run on the CPU here, known before JAX starts (``host_memory`` must act
    before then): ``JAX_PLATFORMS`` if set, else whether no GPU or TPU plugin is installed."""
    platforms = os.environ.get("JAX_PLATFORMS", "").strip()
    if platforms:
        return platforms.split(",")[0].strip() == "cpu"
    plugins = ("jax_cuda12_plugin", "jax_cuda13_plugin", "jax_rocm60_plugin", "libtpu")
    return not any(importlib.util.find_spec(name) for name in plugins)
