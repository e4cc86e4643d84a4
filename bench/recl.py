"""Relative effective context length (Transformer-XL, appendix C) of a group of trained runs.

    .venv/bin/python -m bench.recl --run "txl, memory 128" runs/cmp2k_mem128 128 \\
        --run "txl, memory 0" runs/cmp2k_mem0 0 [--config configs/txl_small.py]
    .venv/bin/python -m bench.recl --ablation txl,shaw,t5 --runs runs/ablation_small --mem-len 64 \\
        --set model.n_layers=4 ...      # bench.ablation's runs, each with and without memory

Restores each run's model (its ``model.mem_len`` given), measures the per-token test loss of the same
tokens with attention spans ``--contexts`` (``relpos_jax.analysis.recl.context_token_losses``: memory length as
the context, ``same_length``), and prints the group's RECL for r = 0.1, 0.5, 1.0 with the mean bpc at
each context, as a markdown table. With ``--ablation``, a second table treats each scheme's pair (with
and without memory) as its own group, as the paper's Table 8 compares models of one family.
"""

from __future__ import annotations

import math
import pathlib

from bench import args as options
from bench.ablation import config_for
from bench.measure import ROOT
from relpos_jax.config import POSITIONS, load_config


def main() -> None:
    parser = options.parser(__doc__)
    parser.add_argument("--run", nargs=3, action="append", metavar=("LABEL", "WORKDIR", "MEM_LEN"))
    parser.add_argument("--config", default="configs/txl_small.py")
    parser.add_argument("--contexts", type=options.ints, default="0,32,64,128,256,512,1024")
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--segment", type=int, default=64)
    parser.add_argument(
        "--ablation",
        type=options.listed(choices=POSITIONS),
        metavar="A,B,...",
        help="schemes whose bench.ablation runs to use (+ memory 0)",
    )
    options.add_runs(parser, "runs/ablation", help="with --ablation")
    parser.add_argument("--mem-len", type=int, default=128, help="with --ablation")
    options.add_overrides(parser, help="with --ablation, as its runs had")
    args = parser.parse_args()

    from relpos_jax import data
    from relpos_jax.analysis.recl import context_token_losses, recl
    from relpos_jax.evaluate import restore_model

    contexts = list(args.contexts)
    runs = []  # (label, config, workdir)
    for label, workdir, mem_len in args.run or ():
        config = load_config(ROOT / args.config, [f"model.mem_len={mem_len}"])
        runs.append((label, config, ROOT / workdir))
    for scheme in args.ablation or ():
        for mem_len in (args.mem_len, 0):
            config = config_for(scheme, mem_len, 0, args.set)
            workdir = pathlib.Path(args.runs) / f"{scheme}_mem{mem_len}_seed0"
            runs.append((f"{scheme}, memory {mem_len}", config, workdir))
    losses = {}
    for label, config, workdir in runs:
        model, cfg, step = restore_model(config, workdir)
        test = data.open_data(cfg.data, "test")
        losses[label] = context_token_losses(
            model, test, contexts, segment_len=args.segment, n_tokens=args.tokens, batch_size=16
        )
        print(
            f"{label} (step {step}):",
            {c: round(float(v.mean()) / math.log(2), 4) for c, v in losses[label].items()},
            flush=True,
        )
    header = (
        "| model | "
        + " | ".join(f"bpc @ {c}" for c in contexts)
        + " | RECL r=0.1 | r=0.5 | r=1.0 |"
    )
    lines = [header, "|---|" + "---:|" * (len(contexts) + 3)]
    results = {r: recl(losses, r=r) for r in (0.1, 0.5, 1.0)}
    for label, by_context in losses.items():
        bpcs = " | ".join(f"{float(v.mean()) / math.log(2):.4f}" for v in by_context.values())
        lines.append(
            f"| {label} | {bpcs} | " + " | ".join(str(results[r][label]) for r in results) + " |"
        )
    print("\n".join(lines))
    if args.ablation:  # each scheme with and without memory as its own group of two
        print(
            "\n| scheme | RECL with memory r=0.1 / 0.5 / 1.0 | without memory r=0.1 / 0.5 / 1.0 |"
        )
        print("|---|---:|---:|")
        for scheme in args.ablation:
            pair = {label: losses[label] for label in losses if label.startswith(f"{scheme}, ")}
            results = [recl(pair, r=r) for r in (0.1, 0.5, 1.0)]
            cells = [" / ".join(str(result[label]) for result in results) for label in pair]
            print(f"| {scheme} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
