"""A device that refuses the program (memory, shared memory, VMEM, a kernel that does not compile)
is one line naming the field to change (``errors.AcceleratorError``), the device's own message kept
in ``error.log``; any other failure surfaces as it is. The messages are the devices' own: the
first is what an H200 printed for the txl kernel's backward."""

from __future__ import annotations

import jax
import pytest

from relpos_jax import cli
from relpos_jax.config import Config
from relpos_jax.errors import AcceleratorError, accelerator_error
from relpos_jax.train import Trainer

H200_SHARED_MEMORY = (
    "RESOURCE_EXHAUSTED: Shared memory size limit exceeded: requested 254208, available: 232448"
)
OUT_OF_MEMORY = "RESOURCE_EXHAUSTED: Out of memory while trying to allocate 12884901888 bytes."
VMEM = (  # libtpu compiling the txl kernels for a v5p chip, window 8,192 + 8,192, head dim 64
    "RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space vmem. "
    "Used 70.32M of 63.94M vmem. Exceeded vmem capacity by 6.38M."
)
MOSAIC = "INTERNAL: Mosaic failed to compile TPU kernel: the max shift in a vreg 889 is larger"


def _config(tiny, **model):
    config, _ = tiny
    config = config.copy_and_resolve_references()
    config.model.update(**model)
    return Config.from_any(config)


@pytest.mark.parametrize(
    "message, field, fix",
    [
        (H200_SHARED_MEMORY, "model.kernel_block=0", "--config.model.kernel_block=32"),
        (VMEM, "model.attention_impl='kernel'", "in VMEM, more than it has; use --config.model"),
        (OUT_OF_MEMORY, "data.batch_size=4", "--config.model.remat=true"),
        (MOSAIC, "model.attention_impl='kernel'", "--config.model.attention_impl=tiled"),
    ],
)
def test_a_device_refusal_is_one_line_naming_the_field(tiny, message, field, fix):
    error = accelerator_error(
        jax.errors.JaxRuntimeError(message), _config(tiny, attention_impl="kernel")
    )
    assert isinstance(error, AcceleratorError)
    text = str(error)
    assert "\n" not in text and text.startswith(field) and fix in text
    assert error.detail == message


def test_other_failures_are_not_dressed_up(tiny):
    config = _config(tiny)
    assert (
        accelerator_error(jax.errors.JaxRuntimeError("INVALID_ARGUMENT: bad shape"), config) is None
    )
    assert accelerator_error(jax.errors.JaxRuntimeError(MOSAIC), config) is None  # dense: no kernel


@pytest.mark.slow
def test_the_trainer_raises_the_one_line_and_the_cli_keeps_the_devices_message(
    tiny, tmp_path, capsys
):
    trainer = Trainer(tiny[0], tmp_path)

    def refused(*args):
        raise jax.errors.JaxRuntimeError(OUT_OF_MEMORY)

    trainer._train_step = refused
    with pytest.raises(AcceleratorError) as raised:
        trainer.run()
    assert isinstance(raised.value.__cause__, jax.errors.JaxRuntimeError)
    with pytest.raises(SystemExit) as exited:
        cli.exit_with_device_failure(raised.value, tmp_path)
    assert exited.value.code == 2
    printed = capsys.readouterr().err.strip()
    assert printed.count("\n") == 0 and printed.startswith("error: data.batch_size=4 is invalid")
    assert OUT_OF_MEMORY in (tmp_path / "error.log").read_text()
