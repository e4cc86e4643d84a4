"""Train short, test long (the ALiBi paper's Table 2, small scale): bpc against evaluation length.

    .venv/bin/python -m bench.extrapolation [--runs runs/ablation_small] [--train-len 64]
        [--factors 1,2,4,8,16] [--tokens 16384] [--stride 32] [--set model.n_layers=4 ...]

Takes the ``mem_len`` 0 models that ``bench.ablation`` trained (``<runs>/<scheme>_mem0_seed0``,
segment ``--train-len``; pass the same ``--set`` overrides) and scores the first ``--tokens`` test
tokens at lengths L = train-len × factor, two ways, with no memory:

- non-overlapping: the tokens cut into segments of L, each scored from scratch;
- sliding window: windows of L moved by ``--stride``, each scoring only its last ``stride`` tokens,
  so that every token sees at least L − stride tokens of context.

RoPE is also scored with its length extensions applied at evaluation time, without retraining (factor
L / train-len): position interpolation (``linear``), NTK-aware (``ntk``), dynamic NTK and YaRN.
Writes ``extrapolation.json`` and ``extrapolation.png`` in ``--out`` and prints the tables.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib

from bench import args as options
from bench.ablation import SCHEMES, config_for

ROPE_EXTENSIONS = ("linear", "ntk", "dynamic", "yarn")


def rope_scaling(kind: str, factor: float, train_len: int) -> dict | None:
    """The HuggingFace ``rope_scaling`` dict of ``kind`` stretched by ``factor``."""
    if factor <= 1:
        return None
    if kind in ("linear", "ntk"):
        return {"rope_type": kind, "factor": factor}
    return {"rope_type": kind, "factor": factor, "original_max_position_embeddings": train_len}


def measure(model, stream, lengths, args) -> dict[str, dict[int, float]]:
    from relpos_jax.evaluate import evaluate, evaluate_sliding

    rows: dict[str, dict[int, float]] = {"non-overlapping": {}, "sliding": {}}
    for length in lengths:
        batch = max(1, args.batch_tokens // length)
        rows["non-overlapping"][length] = evaluate(
            model, stream, batch_size=batch, segment_len=length, mem_len=0,
            max_tokens=args.tokens,
        )["bpc"]  # fmt: skip
        rows["sliding"][length] = evaluate_sliding(
            model, stream, batch_size=batch, window=length, stride=min(args.stride, length),
            max_tokens=args.tokens,
        )["bpc"]  # fmt: skip
        print(
            f"  L={length}: {rows['non-overlapping'][length]:.4f} / {rows['sliding'][length]:.4f}"
        )
    return rows


def plot(results: dict, lengths: list[int], train_len: int, path: pathlib.Path) -> None:
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    colors = colormaps["tab20"].colors
    fig = Figure(figsize=(11, 4), layout="constrained")
    for i, protocol in enumerate(("non-overlapping", "sliding")):
        ax = fig.add_subplot(1, 2, i + 1)
        for k, (label, rows) in enumerate(results.items()):
            values = [rows[protocol][str(n)] for n in lengths]
            style = "--" if label.startswith("rope+") else "-"
            ax.plot(lengths, values, style, marker="o", ms=3, color=colors[k % 20], label=label)
        ax.axvline(train_len, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("evaluation length L (tokens)")
        ax.set_ylabel("test bpc")
        ax.set_ylim(top=min(8.0, ax.get_ylim()[1]))
        ax.set_title(f"{protocol} (trained at {train_len})")
    ax.legend(fontsize=7, ncol=2)
    fig.savefig(path, dpi=120)


def table(results: dict, lengths: list[int], protocol: str) -> str:
    lines = [
        "| scheme | " + " | ".join(f"L={n}" for n in lengths) + " |",
        "|---|" + "---:|" * len(lengths),
    ]
    for label, rows in results.items():
        cells = " | ".join(f"{rows[protocol][str(n)]:.3f}" for n in lengths)
        lines.append(f"| {label} | {cells} |")
    return "\n".join(lines)


def main() -> None:
    parser = options.parser(__doc__)
    options.add_runs(parser, "runs/ablation", help="bench.ablation's")
    options.add_schemes(parser, SCHEMES)
    parser.add_argument("--train-len", type=int, default=128)
    parser.add_argument("--factors", type=options.ints, default="1,2,4,8,16")
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--stride", type=int, default=None, help="default: train-len / 2")
    parser.add_argument("--batch-tokens", type=int, default=8192)
    options.add_seed(parser)
    options.add_overrides(parser, help="the same as bench.ablation's")
    options.add_out(parser)
    args = parser.parse_args()
    args.stride = args.stride or max(1, args.train_len // 2)

    from relpos_jax import data
    from relpos_jax.evaluate import restore_model, with_config

    lengths = [args.train_len * f for f in args.factors]
    results: dict[str, dict] = {}
    for scheme in args.schemes:
        workdir = pathlib.Path(args.runs) / f"{scheme}_mem0_seed{args.seed}"
        config = config_for(scheme, 0, args.seed, args.set)
        model, cfg, _ = restore_model(config, workdir)
        stream = data.open_data(cfg.data, "test")
        print(f"{scheme} ({workdir})")
        results[scheme] = measure(model, stream, lengths, args)
        if scheme != "rope":
            continue
        for kind in ROPE_EXTENSIONS:
            print(f"rope+{kind}")
            rows: dict[str, dict[int, float]] = {"non-overlapping": {}, "sliding": {}}
            for length in lengths:
                scaling = rope_scaling(kind, length / args.train_len, args.train_len)
                scaled = with_config(model, dataclasses.replace(cfg.model, rope_scaling=scaling))
                for protocol, values in measure(scaled, stream, [length], args).items():
                    rows[protocol].update(values)
            results[f"rope+{kind}"] = rows
    results = {  # JSON keys are strings
        label: {p: {str(n): v for n, v in r.items()} for p, r in rows.items()}
        for label, rows in results.items()
    }
    for protocol in ("non-overlapping", "sliding"):
        print(f"\n{protocol}, test bpc over the first {args.tokens:,} test tokens\n")
        print(table(results, lengths, protocol))
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    settings = {k: v for k, v in vars(args).items() if k != "out"}
    (out / "extrapolation.json").write_text(
        json.dumps({"settings": settings, "bpc": results}, indent=1) + "\n"
    )
    plot(results, lengths, args.train_len, out / "extrapolation.png")


if __name__ == "__main__":
    main()
