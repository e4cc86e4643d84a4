"""The platform the model's program is built for, so that what only helps XLA:CPU stays on a CPU.

On a CPU the model lays out its products for XLA:CPU's kernels (``precision._product``), keeps keys
and values ``[B, N, H, K]`` (``Scheme.kv_layout``), draws dropout from a hash that XLA fuses
(``dropout``), and sets the host's allocator (``host_memory``). On a GPU or TPU it is plain
``jnp.einsum`` with float32 accumulation, ``[B, T, N, H]`` keys and values, and JAX's own dropout.

``platform()`` is the default backend's, unless ``target(...)`` names another: a program traced on a
CPU host for a GPU or TPU (``jax.export``, an ahead-of-time compile) is then the accelerator's.
"""

from __future__ import annotations

import contextlib
import contextvars
import importlib.util
import os
from collections.abc import Iterator

import jax

_TARGET: contextvars.ContextVar[str | None] = contextvars.ContextVar("target", default=None)
_ALIASES = {"cuda": "gpu", "rocm": "gpu"}


def platform() -> str:
    """``"cpu"``, ``"gpu"`` or ``"tpu"``: the target set by ``target``, else JAX's default backend."""
    name = _TARGET.get() or jax.default_backend()
    return _ALIASES.get(name, name)


def on_cpu() -> bool:
    return platform() == "cpu"


@contextlib.contextmanager
def target(name: str) -> Iterator[None]:
    """Build models and trace programs for platform ``name`` (``cpu``, ``gpu``/``cuda``, ``tpu``)
    inside this block, whatever this host's devices are."""
    token = _TARGET.set(name)
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
