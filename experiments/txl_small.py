"""The README's first command, measured: ``configs/txl_small.py`` trained as ``make run`` trains it,
then every test token evaluated; the numbers kept in ``txl_small.json`` (settings, commit, machine,
wall time, parameters, valid and test bpc, the learning curve), and ``txl_small.md`` and
``txl_small_curve.png`` rendered from it.

    .venv/bin/python -m experiments.txl_small [--runs runs] [--out docs/results] [--dry-run]

One ``experiments.sweep`` run (``train.py``, then ``eval.py --splits test``), reused when it has finished;
its wall time is recorded only when it ran here.
"""

from __future__ import annotations

import pathlib
import statistics
import sys
import time

from bench import args as options
from bench.measure import ROOT
from experiments import sweep

CONFIG = "configs/txl_small.py"
MODEL_FIELDS = ("position", "n_layers", "d_model", "n_heads", "d_ff", "mem_len")


def _parameters(config) -> int:
    import jax
    from flax import nnx

    from relpos_jax import TransformerLM

    model = nnx.eval_shape(lambda: TransformerLM(config.model, rngs=nnx.Rngs(0)))
    return sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))


def collect(run: sweep.Run, evaluated: dict, seconds: float | None, argv) -> dict:
    """The JSON of the run: its settings, scores and learning curve."""
    from relpos_jax.config import Config, load_config
    from relpos_jax.metrics import read_metrics

    cfg = Config.from_any(load_config(ROOT / CONFIG))
    records = read_metrics(run.workdir)
    train = [[r["step"], r["train/bpc"]] for r in records if "train/bpc" in r]
    valid = [[r["step"], r["valid/bpc"]] for r in records if "valid/bpc" in r]
    speeds = [r["tokens_per_sec"] for r in records if "tokens_per_sec" in r]
    m, d, t = cfg.model, cfg.data, cfg.train
    return {
        "settings": sweep.settings(
            ["experiments.txl_small", *argv],
            config=CONFIG,
            steps=t.steps,
            seconds=seconds,
            model={k: getattr(m, k) for k in MODEL_FIELDS},
            data={"name": d.name, "segment_len": d.segment_len, "batch_size": d.batch_size},
            train={"lr": t.lr, "warmup_steps": t.warmup_steps, "clip": t.clip},
        ),
        "parameters": _parameters(cfg),
        "valid_bpc": valid[-1][1] if valid else None,
        "test_bpc": evaluated["test"]["bpc"],
        "test_tokens": evaluated["test"]["tokens"],
        "tokens_per_sec": statistics.median(speeds) if speeds else None,
        "train_curve": train,
        "valid_curve": valid,
    }


def render(results: dict) -> str:
    s, model = results["settings"], results["settings"]["model"]
    seconds = s.get("seconds")
    lines = [
        "# txl_small on the default corpus: the README's first command",
        "",
        f"Command: `{s['command']}` (`train.py --config {s['config']}` as `make run` runs it, then "
        f"`eval.py --splits test`)  ",
        f"Commit {s['commit']}, {s['machine']}, {s['date']}.",
        "",
        f"Model: {model['position']}, {model['n_layers']} layers, d_model {model['d_model']}, "
        f"{model['n_heads']} heads, d_ff {model['d_ff']}, memory {model['mem_len']}; "
        f"{results['parameters']:,} parameters. Data: {s['data']['name']} (partition "
        f"`{s.get('partition', 'hash')}`), "
        f"{s['data']['batch_size']} rows × {s['data']['segment_len']}-byte segments; "
        f"{s['steps']} steps, Adam {s['train']['lr']:g} with {s['train']['warmup_steps']} warm-up "
        f"steps, clip {s['train']['clip']:g}.",
        "",
        "| | value |",
        "|---|---:|",
        "| wall time of train.py and eval.py (training, the final validation, every test token; "
        "a record, not a speed benchmark: other jobs may have shared the machine) | "
        f"{'not measured (the run was reused)' if seconds is None else f'{seconds / 60:.1f} min'} |",
        f"| training throughput, median of the logged tokens/s | {results['tokens_per_sec']:,.0f} |",
        f"| **valid bpc** (every valid token, after the last step) | **{results['valid_bpc']:.4f}** |",
        f"| **test bpc** (every one of {results['test_tokens']:,} test tokens) | "
        f"**{results['test_bpc']:.4f}** |",
        "",
        "Learning curve (train bpc: the loss of that step's batch; valid bpc: the validation runs "
        "of training):",
        "",
        "| step | train bpc | valid bpc |",
        "|---:|---:|---:|",
    ]
    valid_at = dict(map(tuple, results["valid_curve"]))
    for step, bpc in results["train_curve"]:
        cell = f"{valid_at[step]:.4f}" if step in valid_at else ""
        lines.append(f"| {step} | {bpc:.4f} | {cell} |")
    return "\n".join([*lines, "", "![learning curve](txl_small_curve.png)", ""])


def plot(results: dict, path: pathlib.Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.add_subplot()
    ax.plot(*zip(*results["train_curve"], strict=True), label="train")
    if results["valid_curve"]:
        ax.plot(*zip(*results["valid_curve"], strict=True), "o--", label="valid")
    ax.set(xlabel="step", ylabel="bits per byte", ylim=(None, 4.0))
    ax.grid(alpha=0.3)
    ax.legend()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = options.parser(__doc__)
    sweep.add_options(parser)
    options.add_runs(parser, "runs")
    options.add_out(parser, "docs/results")
    args = parser.parse_args()
    from relpos_jax.config import load_config

    run = sweep.Run("txl_small", pathlib.Path(args.runs) / "txl_small", CONFIG, ())
    steps = load_config(ROOT / CONFIG).train.steps
    if args.dry_run:
        sweep.list_pending(([run], steps))
        return
    ran_here = run.result(steps) is None
    start = time.perf_counter()
    evaluated = sweep.execute([run], steps)[run.name]
    seconds = time.perf_counter() - start if ran_here else None
    results = collect(run, evaluated, seconds, sys.argv[1:])
    sweep.publish(args.out, "txl_small", results, render, plot, png="txl_small_curve.png")


if __name__ == "__main__":
    main()
