"""Context parallelism: the longest context whose training step fits a per-device memory budget, on
1, 2, 4 and 8 devices of the ``context`` axis (simulated CPU devices, one process).

    python -m bench.context_parallel [--devices 1,2,4,8] [--budget-mib 512] [--schemes txl]

For each scheme and device count c, compiles the training step (forward and backward, batch 1,
segment = memory = K/2, txl_small's sizes, tiled attention in 512 × 512 tiles) at contexts
K = 1k, 2k, … and reads XLA's per-device memory of the compiled program (arguments + outputs +
temporaries); the longest K within ``--budget-mib`` is the row, with its memory and the memory at
the next K. With ``--run`` the step also runs once at that K (seconds in the table). The JSON
goes to ``docs/benchmarks/context_parallel.json``, the table to ``docs/benchmarks/context_parallel.md``
(``--out`` another folder).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import subprocess
import sys
import time

from bench.measure import ROOT, commit

RESULTS = ROOT / "docs" / "benchmarks"


def measure(scheme: str, devices: int, context: int, run: bool) -> dict:
    """Per-device MiB of the compiled training step at window K = ``context`` on ``devices``."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    from relpos_jax import TransformerLM, sharding
    from relpos_jax.config import Config, MeshConfig, load_config
    from relpos_jax.memory import Memory

    cfg = load_config(ROOT / "configs" / "txl_small.py")
    half = context // 2
    cfg.model.update(
        position=scheme, mem_len=half, attention_impl="tiled", key_tile=512, query_tile=512,
        dropout=0.0, learned={"max_len": max(4096, context)},
    )  # fmt: skip
    cfg = Config.from_any(cfg)
    mesh = sharding.make_mesh(
        MeshConfig(data=1, fsdp=1, tensor=1, context=devices), jax.devices()[:devices]
    )
    model = nnx.eval_shape(lambda: TransformerLM(cfg.model, rngs=nnx.Rngs(0)))
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    segment = jax.ShapeDtypeStruct((1, half), jnp.int32)
    states = jax.eval_shape(lambda: model.init_mems(1)).states

    def loss(params, rest, inputs, targets, states):
        lm = nnx.merge(graphdef, params, rest)
        logits, _ = lm(inputs, Memory(states, jnp.asarray(half, jnp.int32)))
        return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

    replicated, split = sharding.replicated(mesh), sharding.batch_sharding(mesh)
    step = jax.jit(
        sharding.under_mesh(mesh, jax.grad(loss)),
        in_shardings=(replicated, replicated, split, split, sharding.memory_sharding(mesh).states),
    )
    start = time.perf_counter()
    compiled = step.lower(params, rest, segment, segment, states).compile()
    analysis = compiled.memory_analysis()
    result = {
        "mib": (
            analysis.argument_size_in_bytes
            + analysis.output_size_in_bytes
            + analysis.temp_size_in_bytes
            - analysis.alias_size_in_bytes
        )
        / 2**20,
        "temp_mib": analysis.temp_size_in_bytes / 2**20,
        "compile_s": time.perf_counter() - start,
    }
    if run:
        _, p, r = nnx.split(TransformerLM(cfg.model, rngs=nnx.Rngs(0)), nnx.Param, ...)
        tokens = jax.random.randint(jax.random.key(0), (2, 1, half), 0, 256)
        zeros = jnp.zeros(states.shape, states.dtype)
        start = time.perf_counter()
        jax.block_until_ready(compiled(p, r, tokens[0], tokens[1], zeros))
        result["step_s"] = time.perf_counter() - start
    return result


def _child(args) -> None:
    print(json.dumps(measure(args.scheme, args.n, args.context, args.run)))


def _spawn(scheme: str, devices: int, context: int, run: bool) -> dict:
    """``measure`` in a fresh process with 8 simulated CPU devices (each cell compiles alone)."""
    flags = os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8"
    command = [sys.executable, "-m", "bench.context_parallel", "--child", "--scheme", scheme]
    command += ["--n", str(devices), "--context", str(context)] + (["--run"] if run else [])
    done = subprocess.run(
        command, cwd=ROOT, capture_output=True, text=True,
        env={**os.environ, "XLA_FLAGS": flags, "JAX_PLATFORMS": "cpu"},
    )  # fmt: skip
    if done.returncode:
        raise RuntimeError(done.stderr[-2000:])
    return json.loads(done.stdout.strip().splitlines()[-1])


def table(result: dict) -> str:
    lines = [
        "# Context parallelism: the longest context that trains within a per-device budget",
        "",
        f"Command: `{result['command']}`; commit {result['commit']}, {result['date']}; "
        f"{result['machine']}. XLA's per-device memory of the compiled training step (arguments + "
        f"outputs + temporaries), txl_small sizes, batch 1, segment = memory = K/2, tiles "
        f"512 × 512, budget {result['budget_mib']:,} MiB per device.",
        "",
        "| scheme | devices | longest K | MiB per device | at 2K: MiB per device | step s |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    shown = lambda x, form: "–" if x is None else format(x, form)  # noqa: E731
    for row in result["rows"]:
        lines.append(
            f"| {row['scheme']} | {row['devices']} | {shown(row['longest'], ',')} | "
            f"{shown(row['mib'], ',.0f')} | {shown(row['next_mib'], ',.0f')} | "
            f"{shown(row.get('step_s'), '.1f')} |"
        )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", default="1,2,4,8")
    parser.add_argument("--schemes", default="txl")
    parser.add_argument("--budget-mib", type=int, default=512)
    parser.add_argument("--start", type=int, default=1024)
    parser.add_argument("--limit", type=int, default=131072)
    parser.add_argument("--run", action="store_true")
    parser.add_argument("--out", type=pathlib.Path, default=RESULTS, help="where the files go")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--scheme", help=argparse.SUPPRESS)
    parser.add_argument("--n", type=int, help=argparse.SUPPRESS)
    parser.add_argument("--context", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return _child(args)
    rows = []
    for scheme in args.schemes.split(","):
        for devices in map(int, args.devices.split(",")):
            context, best, best_mib, next_mib = args.start, None, None, None
            while context <= args.limit:
                cell = _spawn(scheme, devices, context, run=False)
                print(f"{scheme} c={devices} K={context}: {cell['mib']:.0f} MiB", flush=True)
                if cell["mib"] > args.budget_mib:
                    next_mib = cell["mib"]
                    break
                best, best_mib = context, cell["mib"]
                context *= 2
            row = {"scheme": scheme, "devices": devices, "longest": best, "mib": best_mib}
            row["next_mib"] = next_mib
            if args.run and best:
                row["step_s"] = _spawn(scheme, devices, best, run=True)["step_s"]
            rows.append(row)
    result = {
        "command": "python -m bench.context_parallel " + " ".join(sys.argv[1:]),
        "commit": commit(),
        "date": datetime.date.today().isoformat(),
        "machine": f"{os.cpu_count()} CPU cores, simulated devices in one process",
        "budget_mib": args.budget_mib,
        "rows": rows,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "context_parallel.json").write_text(json.dumps(result, indent=2) + "\n")
    (args.out / "context_parallel.md").write_text(table(result))
    print(table(result))


if __name__ == "__main__":
    main()
