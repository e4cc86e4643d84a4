"""Which TPU slice each of the paper's configs fits, with which mesh: ``docs/benchmarks/aot.{json,md}``.

    python -m bench.aot_table [--rows base] [--out docs/benchmarks]

Compiles the training and evaluation steps of every row of ``ROWS`` (``relpos_jax.aot``, the TPU
compiler of the tpu extra on this host, no TPU), all in this process, bf16, the paper's batch;
where a training step does not fit a chip's HBM, the first of ``aot.smaller``'s changes that fits is
compiled and named. ``--rows`` keeps the rows whose label contains one of the given words. The
markdown is rendered from the JSON (``render``).
"""

from __future__ import annotations

import datetime
import json
import pathlib
import time

from bench import aot as aot_cli  # noqa: F401  (sets the CPU host's TPU environment first)
from bench import args as bench_args
from bench.measure import ROOT, commit, machine

# (label, config, topology, overrides): the slice names as Google Cloud sells them (v5p-N counts
# TensorCores, two a chip), the mesh each batch needs
ROWS = [
    ("base enwik8 · v5e-4", "txl_base_enwik8", "v5e:2x2", ["mesh.data=2", "mesh.tensor=2"]),
    ("base enwik8 · v5e-8", "txl_base_enwik8", "v5e:2x4", ["mesh.data=2", "mesh.tensor=4"]),
    ("base enwik8 · v5p-8", "txl_base_enwik8", "v5p:2x2x1", ["mesh.data=2", "mesh.tensor=2"]),
    ("base enwik8 · v5p-8 · tiled", "txl_base_enwik8", "v5p:2x2x1",
     ["mesh.data=2", "mesh.tensor=2", "model.attention_impl=tiled"]),
    ("base enwik8 · v5p-8 · dense", "txl_base_enwik8", "v5p:2x2x1",
     ["mesh.data=2", "mesh.tensor=2", "model.attention_impl=dense"]),
    ("base wt103 · v5e-8", "txl_base_wt103", "v5e:2x4", ["mesh.data=4", "mesh.tensor=2"]),
    ("base wt103 · v5p-8", "txl_base_wt103", "v5p:2x2x1", ["mesh.data=4"]),
    ("large wt103 · v5e-16", "txl_large_wt103", "v5e:4x4", ["mesh.data=16"]),
    ("large wt103 · v5p-32", "txl_large_wt103", "v5p:2x2x4", ["mesh.data=16"]),
    ("large enwik8 · v5e-16", "txl_large_enwik8", "v5e:4x4", ["mesh.data=16"]),
    ("large enwik8 · v5p-32", "txl_large_enwik8", "v5p:2x2x4", ["mesh.data=16"]),
    ("large enwik8 · v5p-64", "txl_large_enwik8", "v5p:2x4x4", ["mesh.data=32"]),
    ("large enwik8 · v5p-32 · context 2", "txl_large_enwik8", "v5p:2x2x4",
     ["mesh.data=8", "mesh.context=2", "model.attention_impl=tiled"]),
]  # fmt: skip
COMMON = ["model.dtype=bfloat16", "model.attention_impl=auto"]


def measure(label: str, config_name: str, topology: str, overrides: list[str]) -> dict:
    from bench.mfu import step_flops
    from relpos_jax import aot
    from relpos_jax.config import ConfigError, load_config
    from relpos_jax.errors import AcceleratorError

    sets = [*COMMON, *overrides]
    row = {"label": label, "config": config_name, "topology": topology, "overrides": sets}
    config = load_config(ROOT / "configs" / f"{config_name}.py", sets)
    devices = aot.topology(topology)
    row.update(
        chips=len(devices), device_kind=devices[0].device_kind, hbm_bytes=aot.hbm_bytes(devices),
        model_flops=step_flops(config),
    )  # fmt: skip
    for step, compile_step in (("train", aot.train_step), ("eval", aot.eval_step)):
        try:
            program = compile_step(config, devices)
            fits = row["hbm_bytes"] is None or program.chip_bytes <= row["hbm_bytes"]
            row[step] = {**_record(program), "fits": fits}
        except aot.DoesNotFit as error:
            row[step] = {"fits": False, "chip_bytes": error.needs_bytes}
        except (ConfigError, AcceleratorError) as error:
            row[step] = {"fits": False, "error": str(error)}
            continue
        if step == "train" and not row[step]["fits"]:
            found = aot.fit(config, devices, compile_step)
            if found is not None:
                change, program = found
                row[step]["fits_with"] = {"change": change, **_record(program)}
        print(json.dumps({"label": label, step: row[step]}), flush=True)
    return row


def _record(program) -> dict:
    keys = ("compile_s", "argument_bytes", "temp_bytes", "code_bytes")
    return {"chip_bytes": program.chip_bytes, **{k: getattr(program, k) for k in keys}}


def _gib(x: float) -> str:
    return f"{x / 2**30:.1f}"


def _cell(step: dict) -> str:
    """A step's cell: GiB a chip and compile seconds; or why it does not fit."""
    if "error" in step:
        return f"error: {step['error']}"
    if step["fits"]:
        return f"{_gib(step['chip_bytes'])} GiB · {step['compile_s']:.0f} s"
    cell = f"needs {_gib(step['chip_bytes'])} GiB"
    if "fits_with" in step:
        fit = step["fits_with"]
        change = ", ".join(f"{k}={v}" for k, v in fit["change"].items())
        cell += f"; with {change}: {_gib(fit['chip_bytes'])} GiB · {fit['compile_s']:.0f} s"
    return cell


def render(results: dict) -> str:
    lines = [
        "# The paper's configs on TPU slices, compiled ahead of time",
        "",
        f"Written by `{results['command']}` from `aot.json`: each row's training and evaluation "
        "steps compiled by the TPU compiler (libtpu "
        f"{results['libtpu']}, jax {results['jax']}) for the slice's chips without them, on "
        f"{results['machine']}, at commit {results['commit']}, {results['date']}.",
        "",
        "Every row: bf16, `model.attention_impl=auto` (the Mosaic kernels where the scheme and head "
        "dim allow, else dense or tiled), the config's own batch, segment and memory; its mesh in "
        "the overrides. A cell: what a chip holds at the step's peak (arguments, outputs not "
        "aliased, temporaries, code) · compile seconds. TFLOP: the model's a training step "
        "(`bench.mfu.step_flops`: matrix products, backward twice the forward), and a chip's share. A "
        "training step that does not fit is compiled again with the first change that fits "
        "(`model.remat`, then the parameters over `mesh.fsdp`, then `train.grad_accum`; none "
        "changes the optimisation). An evaluation batch that the data devices do not divide is "
        "replicated on every chip, as `eval.py` places it (large enwik8 on v5p-64: 16 rows, 32 "
        "chips). A slice is named as Google Cloud sells it: v5p-N counts TensorCores, two a chip. "
        "HBM a chip: v5e 16 GiB, v5p 95 GiB. The same figures for one "
        "config: `python -m bench.aot --config <file> --topology <slice> --set …`.",
        "",
        "| row | chips | overrides | TFLOP a step (a chip) | train step | eval step |",
        "|---|---:|---|---:|---|---|",
    ]
    for row in results["rows"]:
        sets = " ".join(f"`{s}`" for s in row["overrides"] if s not in COMMON)
        lines.append(
            f"| {row['label']} | {row['chips']} × {row['device_kind']} | {sets} | "
            f"{row['model_flops'] / 1e12:.3g} ({row['model_flops'] / row['chips'] / 1e12:.3g}) | "
            f"{_cell(row['train'])} | {_cell(row['eval'])} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = bench_args.parser(__doc__)
    parser.add_argument("--rows", type=bench_args.listed(), default="", help="words of the labels")
    bench_args.add_out(parser)
    options = parser.parse_args()
    import importlib.metadata

    import jax

    rows = [r for r in ROWS if not options.rows or any(w in r[0] for w in options.rows)]
    start = time.perf_counter()
    measured = []
    for row in rows:
        print(f"{row[0]} …", flush=True)
        measured.append(measure(*row))
    out = pathlib.Path(options.out)
    results = {
        "command": "python -m bench.aot_table", "commit": commit(), "machine": machine(),
        "date": datetime.date.today().isoformat(), "jax": jax.__version__,
        "libtpu": importlib.metadata.version("libtpu"), "seconds": time.perf_counter() - start,
        "rows": measured,
    }  # fmt: skip
    out.mkdir(parents=True, exist_ok=True)
    (out / "aot.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "aot.md").write_text(render(results))
    print(f"wrote {out / 'aot.json'} and aot.md in {results['seconds'] / 60:.1f} min", flush=True)


if __name__ == "__main__":
    main()
