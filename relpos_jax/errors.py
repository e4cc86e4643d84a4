"""The user errors, each one line naming the field, value and fix: an invalid config value
(``ConfigError``), and a device that refused the program (``AcceleratorError``)."""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """An invalid config value; the message is one line: field, value, fix."""


def fail(field: str, value: Any, fix: str) -> None:
    shown = " ".join(repr(value).split())  # one line, even for an array or a nested dict
    raise ConfigError(f"{field}={shown} is invalid; {fix}")


def at_least(field: str, value: Any, low: int) -> None:
    """Refuse ``value`` unless it is an integer ≥ ``low``, naming ``field``."""
    if not isinstance(value, int) or isinstance(value, bool) or value < low:
        fail(field, value, f"use an integer ≥ {low}")


class AcceleratorError(RuntimeError):
    """A GPU or TPU refused the program (its memory, shared memory or VMEM; a kernel that did not
    compile): one line naming the field to change. ``detail`` keeps the device's own message."""

    def __init__(self, message: str, detail: str):
        super().__init__(message)
        self.detail = detail


def accelerator_error(error: BaseException, config: Any) -> AcceleratorError | None:
    """The one-line ``AcceleratorError`` for a device's failure of a known kind, from a validated
    ``Config``; None for any other failure (which then surfaces as it is)."""
    text = str(error)
    lower = text.lower()
    model, data, train = config.model, config.data, config.train
    where = f"on {_device()}"
    if "shared memory size limit" in lower:
        return AcceleratorError(
            f"model.kernel_block={model.kernel_block} is invalid {where}: the attention kernels' "
            "blocks need more shared memory than it has; set --config.model.kernel_block=32 (or "
            "16), or --config.model.attention_impl=tiled",
            text,
        )
    if "vmem" in lower and "exceed" in lower:  # a TPU kernel holds the layer's whole window
        window = f"data.segment_len={data.segment_len} + model.mem_len={model.mem_len}"
        return AcceleratorError(
            f"model.attention_impl={model.attention_impl!r} is invalid {where}: the attention "
            f"kernels hold the layer's whole window ({window}) in VMEM, more than it has; use "
            "--config.model.attention_impl=tiled, or a shorter segment or memory",
            text,
        )
    if "resource_exhausted" in lower or "out of memory" in lower:
        return AcceleratorError(
            f"data.batch_size={data.batch_size} is invalid {where}: the step does not fit its "
            f"memory; lower --config.data.batch_size, raise --config.train.grad_accum (now "
            f"{train.grad_accum}), set --config.model.remat=true, or "
            "--config.model.attention_impl=tiled",
            text,
        )
    kernels = ("mosaic", "triton", "pallas")
    if model.attention_impl in ("kernel", "auto") and any(k in lower for k in kernels):
        return AcceleratorError(
            f"model.attention_impl={model.attention_impl!r} is invalid {where}: its Pallas "
            "kernels did not compile; use --config.model.attention_impl=tiled",
            text,
        )
    return None


def _device() -> str:
    """The device the program was built for: the target's (an ahead-of-time compile), else JAX's."""
    from relpos_jax.ops import backend

    return backend.device_kind() or "this device"
