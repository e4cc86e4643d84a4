"""Compile a config's training and evaluation steps for a TPU slice on this host; what a chip holds.

    python -m bench.aot --config configs/txl_base_enwik8.py --topology v5p:2x2x1 \\
        [--set model.dtype=bfloat16 --set mesh.data=2 --set mesh.tensor=2 ...] [--json FILE]

The TPU compiler (libtpu: ``pip install -e '.[tpu]'``, or ``make test-tpu``'s ``.venv-tpu``) compiles
both steps for the slice's chips without them (``relpos_jax.aot``) and prints, per chip, the memory
(arguments, temporaries, code) against the chip's HBM and the compile time, and the model's FLOPs a
training step (``bench.mfu.step_flops``: the compiler counts a loop's body, the scanned layers, once). A
step that does not fit ends the run in one line (exit code 2) that names the fields that make it fit,
found by compiling with them; a config the slice cannot take (batch, mesh) fails in one line too.
Topologies are ``generation:chips`` as ``jax.experimental.topologies`` names them: ``v5e:2x2`` (4
chips), ``v5e:4x4``, ``v5p:2x2x1`` (4), ``v5p:2x2x4`` (16), ``v6e:2x2``, ``v4:2x2x1``.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys

from bench import args as bench_args

# A CPU host: no TPU runtime to look for (libtpu would ask the cloud's metadata server, and warn)
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")

STEPS = ("train", "eval")


def describe(name: str, devices, mesh_shape) -> str:
    from relpos_jax import aot, sharding

    hbm = aot.hbm_bytes(devices)
    memory = "HBM unknown" if hbm is None else f"{hbm / aot.GIB:.0f} GiB HBM a chip"
    axes = " × ".join(
        f"{axis} {size}" for axis, size in zip(sharding.AXES, mesh_shape, strict=True)
    )
    hosts = aot.hosts(devices)
    return (
        f"{name}: {len(devices)} chips of {devices[0].device_kind} ({memory}), {hosts} "
        f"host{'s' * (hosts > 1)}; mesh {axes}"
    )


def line(program, hbm: int | None) -> str:
    from relpos_jax.aot import GIB

    of = "" if hbm is None else f" of {hbm / GIB:.0f} GiB"
    return (
        f"{program.name}: compiled in {program.compile_s:.1f} s; a chip holds "
        f"{program.chip_bytes / GIB:.2f} GiB{of} (arguments {program.argument_bytes / GIB:.2f}, "
        f"temporaries {program.temp_bytes / GIB:.2f}, code {program.code_bytes / GIB:.2f})"
    )


def record(program) -> dict:
    from dataclasses import asdict

    return {**asdict(program), "chip_bytes": program.chip_bytes}


def main(argv: list[str] | None = None) -> dict:
    parser = bench_args.parser(__doc__)
    parser.add_argument("--config", required=True, help="a config file, e.g. configs/txl_small.py")
    parser.add_argument("--topology", required=True, help="a TPU slice, e.g. v5p:2x2x1")
    parser.add_argument("--steps", type=bench_args.listed(choices=STEPS), default="train,eval")
    parser.add_argument("--json", help="also write the figures to this file")
    bench_args.add_overrides(parser, "as train.py would take it")
    options = parser.parse_args(argv)

    from bench.mfu import step_flops
    from relpos_jax import aot, sharding
    from relpos_jax.cli import USER_ERRORS, exit_with
    from relpos_jax.config import Config, load_config
    from relpos_jax.errors import AcceleratorError

    try:
        config = load_config(options.config, options.set)
        devices = aot.topology(options.topology)
        mesh_shape = sharding.mesh_shape(Config.from_any(config).mesh, len(devices))
        print(describe(options.topology, devices, mesh_shape), flush=True)
        flops = step_flops(Config.from_any(config))
        print(
            f"model: {flops / 1e12:.3g} TFLOP a training step, {flops / len(devices) / 1e12:.3g} "
            "a chip", flush=True,
        )  # fmt: skip
        hbm = aot.hbm_bytes(devices)
        compilers = {"train": aot.train_step, "eval": aot.eval_step}
        result = {
            "config": options.config, "overrides": options.set, "topology": options.topology,
            "chips": len(devices), "device_kind": devices[0].device_kind, "hbm_bytes": hbm,
            "mesh": dict(zip(sharding.AXES, mesh_shape, strict=True)), "model_flops": flops,
            "steps": {},
        }  # fmt: skip
        for step in options.steps:
            try:
                program = compilers[step](config, devices)
            except aot.DoesNotFit as error:
                _refuse(step, error.needs_bytes, hbm, config, devices, compilers[step])
            print(line(program, hbm), flush=True)
            result["steps"][step] = record(program)
            if hbm is not None and program.chip_bytes > hbm:
                _refuse(step, program.chip_bytes, hbm, config, devices, compilers[step])
    except (*USER_ERRORS, AcceleratorError) as error:
        exit_with(str(error))
    if options.json:
        pathlib.Path(options.json).write_text(json.dumps(result, indent=1) + "\n")
    return result


def _refuse(step: str, needs_bytes: int, hbm: int | None, config, devices, compile_step) -> None:
    """One line (exit code 2): the step does not fit, and the fields under which it does."""
    from relpos_jax import aot
    from relpos_jax.cli import exit_with

    of = "" if hbm is None else f" of {hbm / aot.GIB:.0f}"
    needs = f"{needs_bytes / aot.GIB:.1f} GiB a chip{of}"
    print(
        f"{step} step: needs {needs}; compiling with the fields that would make it fit", flush=True
    )
    needs = f"the {step} step needs {needs}"
    if step == "eval":
        exit_with(f"{needs}: lower eval.batch_size or eval.mem_len, or take a larger slice")
    found = aot.fit(config, devices, compile_step)
    if found is None:
        exit_with(
            f"{needs}: it does not fit with model.remat, mesh.fsdp or train.grad_accum either; "
            "lower data.batch_size, split the segment over mesh.context, or take a larger slice"
        )
    change, fitted = found
    exit_with(
        f"{needs}: it fits with {aot.overrides(change)} "
        f"({fitted.chip_bytes / aot.GIB:.1f} GiB a chip)"
    )


if __name__ == "__main__":
    main(sys.argv[1:])
