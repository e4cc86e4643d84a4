"""Compile time of the training step against depth: what layers as one scan buy.

    python -m bench.compile_depth [--layers 12,24,48] [--d-model 128] [--out docs/benchmarks]

Traces, lowers and compiles ``train_step.train_step_fn`` (forward, backward, Adam, memory carried,
dropout 0.1) for txl_small with ``--layers`` layers of width ``--d-model`` (4 heads, d_ff 4·d,
segment and memory 64, batch 4, bf16), each depth in this process with the persistent compilation
cache off, and merges the times into ``compile_depth.json`` under this commit (rows of other commits
are kept: run it at an older commit, ``--out`` this folder, to set the two side by side).
``compile_depth.md`` is rendered from the JSON. The GPU figures are ``bench.gpu``'s depth table.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import json
import pathlib
import time

from bench.measure import ROOT, commit, machine


def measure(layers: int, d_model: int) -> dict:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    from relpos_jax import TransformerLM, load_config
    from relpos_jax.config import Config
    from relpos_jax.train_step import make_optimizer, train_step_fn

    config = load_config(ROOT / "configs" / "txl_small.py")
    config.model.update(
        n_layers=layers, d_model=d_model, d_ff=4 * d_model, n_heads=4, mem_len=64,
        dropout=0.1, dtype="bfloat16",
    )  # fmt: skip
    config.data.update(segment_len=64, batch_size=4)
    cfg = Config.from_any(config)
    model = TransformerLM(cfg.model, rngs=nnx.Rngs(params=0, dropout=1))
    optimizer = nnx.Optimizer(model, make_optimizer(cfg.train), wrt=nnx.Param)
    graphdef, state = nnx.split((model, optimizer))
    batch = {k: jnp.zeros((4, 64), jnp.int32) for k in ("inputs", "targets")}
    step = jax.jit(functools.partial(train_step_fn, graphdef, 1))
    start = time.perf_counter()
    lowered = step.lower(state, batch, model.init_mems(4))
    traced = time.perf_counter()
    lowered.compile()
    done = time.perf_counter()
    return {"layers": layers, "lower_s": traced - start, "compile_s": done - traced}


def render(results: dict) -> str:
    lines = [
        "# Compile time of the training step against depth",
        "",
        "Written by `python -m bench.compile_depth` from `compile_depth.json`: txl_small's",
        "training step (bf16, dropout 0.1, Adam, memory 64, segment 64, batch 4) at d_model "
        f"{results['d_model']},",
        "traced + lowered and compiled in one process each commit, no compilation cache. Seconds;",
        "each commit's machine, jax version and date are in its row.",
        "",
        "| commit | layers | trace + lower (s) | compile (s) | total (s) | machine, jax, date |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for run in results["runs"]:
        for row in run["rows"]:
            total = row["lower_s"] + row["compile_s"]
            lines.append(
                f"| {run['commit']} ({run['label']}) | {row['layers']} | {row['lower_s']:.1f} | "
                f"{row['compile_s']:.1f} | {total:.1f} | {run['machine']}, jax {run['jax']}, "
                f"{run['date']} |"
            )
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--layers", default="12,24,48")
    parser.add_argument("--d-model", type=int, default=128)
    parser.add_argument("--out", default=str(ROOT / "docs" / "benchmarks"))
    parser.add_argument("--label", default="", help="what this commit's model is, for the table")
    args = parser.parse_args()
    import jax

    jax.config.update("jax_enable_compilation_cache", False)
    rows = []
    for layers in map(int, args.layers.split(",")):
        rows.append(measure(layers, args.d_model))
        print(json.dumps(rows[-1]), flush=True)
    out = pathlib.Path(args.out)
    path = out / "compile_depth.json"
    results = (
        json.loads(path.read_text()) if path.exists() else {"d_model": args.d_model, "runs": []}
    )
    if results["d_model"] != args.d_model:
        raise SystemExit(
            f"--d-model={args.d_model} is invalid; {path} holds d_model {results['d_model']}"
        )
    here = commit()
    run = {
        "commit": here, "label": args.label, "machine": machine(), "jax": jax.__version__,
        "date": datetime.date.today().isoformat(), "rows": rows,
    }  # fmt: skip
    results["runs"] = [r for r in results["runs"] if r["commit"] != here] + [run]
    out.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1) + "\n")
    (out / "compile_depth.md").write_text(render(results))
    print(f"wrote {path} and compile_depth.md", flush=True)


if __name__ == "__main__":
    main()
