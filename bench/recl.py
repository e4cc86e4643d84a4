"""Relative effective context length (Transformer-XL, appendix C) of groups of trained runs, over seeds.

    .venv/bin/python -m bench.recl --run "txl, memory 128" runs/cmp2k_mem128 128 \\
        --run "txl, memory 0" runs/cmp2k_mem0 0 [--config configs/txl_small.py]
    .venv/bin/python -m bench.recl --ablation txl,shaw,t5 --runs runs/ablation --mem-len 64 \\
        --seeds 0,1,2 --set model.n_layers=4 ...   # bench.ablation's runs, with and without memory

Restores each run's model, measures the per-token test loss of the same tokens with attention spans
``--contexts`` (``relpos_jax.analysis.recl.context_token_losses``: memory length as the context,
``same_length``) and computes the group's RECL for r = 0.1, 0.5, 1.0. With ``--ablation`` the group is
every scheme's pair of runs of one seed (each seed its own group), and each scheme's pair is also
scored as a group of two, as the paper's Table 8 compares models of one family. Writes ``recl.json``
(settings, every seed's bpc by context and RECL) after each group and renders ``recl.md`` (mean ± sd
over seeds) from it. A killed sweep goes on where it stopped: a group the JSON already holds, with
the same contexts, tokens and segment and every run's ``eval.json`` unchanged, is not measured again.
"""

from __future__ import annotations

import json
import math
import pathlib
import sys

from bench import args as options
from bench import sweep
from bench.ablation import config_for
from bench.measure import ROOT
from relpos_jax.config import POSITIONS, load_config

R_VALUES = (0.1, 0.5, 1.0)


def groups_of(args) -> dict[int | None, list[tuple[str, str | None, object, pathlib.Path]]]:
    """The groups by seed (None: the ``--run`` group): (label, scheme, config, workdir) each."""
    groups: dict[int | None, list] = {}
    for label, workdir, mem_len in args.run or ():
        config = load_config(ROOT / args.config, [f"model.mem_len={mem_len}"])
        groups.setdefault(None, []).append((label, None, config, ROOT / workdir))
    for seed in args.seeds if args.ablation else ():
        for scheme in args.ablation:
            for mem_len in (args.mem_len, 0):
                config = config_for(scheme, mem_len, seed, args.set)
                workdir = pathlib.Path(args.runs) / f"{scheme}_mem{mem_len}_seed{seed}"
                groups.setdefault(seed, []).append(
                    (f"{scheme}, memory {mem_len}", scheme, config, workdir)
                )
    return groups


def measure(args, seed, group) -> list[dict]:
    """Each run of one group: its bpc at each context, its RECL in the group and, for ablation runs,
    in its scheme's pair."""
    from relpos_jax import data
    from relpos_jax.analysis.recl import context_token_losses, recl
    from relpos_jax.evaluate import restore_model

    losses, rows = {}, []
    for label, scheme, config, workdir in group:
        model, cfg, step = restore_model(config, workdir)
        test = data.open_data(cfg.data, "test")
        losses[label] = context_token_losses(
            model, test, args.contexts, segment_len=args.segment, n_tokens=args.tokens,
            batch_size=16,
        )  # fmt: skip
        bpc = {str(c): float(v.mean()) / math.log(2) for c, v in losses[label].items()}
        print(f"{label}, seed {seed} (step {step}):", {c: round(b, 4) for c, b in bpc.items()})
        rows.append({
            "label": label, "scheme": scheme, "seed": seed, "mem_len": cfg.model.mem_len, "bpc": bpc,
            "trained": trained(workdir),
        })  # fmt: skip
    in_group = {r: recl(losses, r=r) for r in R_VALUES}
    for row in rows:
        row["recl"] = {str(r): in_group[r][row["label"]] for r in R_VALUES}
        if row["scheme"] is not None:
            pair = {k: v for k, v in losses.items() if k.startswith(f"{row['scheme']}, ")}
            row["pair_recl"] = {str(r): recl(pair, r=r)[row["label"]] for r in R_VALUES}
    return rows


def trained(workdir: pathlib.Path) -> dict | None:
    """What identifies a run's training: its ``eval.json`` step and test bpc (None without one)."""
    done = pathlib.Path(workdir) / "eval.json"
    if not done.exists():
        return None
    result = json.loads(done.read_text())
    return {"step": result.get("step"), "test_bpc": result.get("test", {}).get("bpc")}


def measured_before(earlier: dict | None, settings: dict, seed, group) -> list[dict] | None:
    """The rows of ``group`` that ``earlier`` (a ``recl.json``) holds, if it measured this very
    group (its labels, of runs trained as they are now) with the same contexts, tokens, segment."""
    if (
        earlier is None
        or any(earlier.get(k) != settings[k] for k in ("contexts", "r"))
        or any(earlier["settings"].get(k) != settings["settings"][k] for k in ("tokens", "segment"))
    ):
        return None
    rows = [row for row in earlier["runs"] if row["seed"] == seed]
    if [row["label"] for row in rows] != [label for label, *_ in group]:
        return None
    now = [trained(workdir) for *_, workdir in group]
    if any(t is None or row.get("trained") != t for row, t in zip(rows, now, strict=True)):
        return None
    return rows


def _cell(values: list[float], longest: int, digits: int = 0) -> str:
    """Mean ± sd; "≥" where a seed's RECL reached the longest context (a lower bound)."""
    bound = "≥" if any(v >= longest for v in values) else ""
    return bound + sweep.mean_sd_text(values, digits)


def render(results: dict) -> str:
    s, contexts = results["settings"], results["contexts"]
    longest = contexts[-1]
    by_label: dict[str, list[dict]] = {}
    for row in results["runs"]:
        by_label.setdefault(row["label"], []).append(row)
    lines = [
        "# Relative effective context length (Transformer-XL, appendix C)",
        "",
        f"Command: `{s['command']}`  ",
        f"Commit {s['commit']}, {s['machine']}, {s['date']}. The same {s['tokens']:,} test tokens "
        f"for every model and context, segments of {s['segment']}, the memory length as the context "
        "(same_length); the group's per-token best loss at c is the baseline; RECL is the first c "
        "whose step to the next context gains less than 1% over the top-r hardest tokens. Mean ± "
        "sd over the seeds (each seed's runs are one group); ≥: some seed still gained at the "
        f"longest context, {longest}, so that mean is a lower bound.",
        "",
        "| model | seeds | "
        + " | ".join(f"bpc @ {c}" for c in contexts)
        + " | "
        + " | ".join(f"RECL r={r}" for r in results["r"])
        + " |",
        "|---|---:|" + "---:|" * (len(contexts) + len(results["r"])),
    ]
    for label, rows in by_label.items():
        bpc = [_cell([row["bpc"][str(c)] for row in rows], math.inf, 4) for c in contexts]
        recl = [_cell([row["recl"][str(r)] for row in rows], longest) for r in results["r"]]
        lines.append(f"| {label} | {len(rows)} | " + " | ".join(bpc + recl) + " |")
    pairs = [label for label, rows in by_label.items() if "pair_recl" in rows[0]]
    if pairs:
        lines += [
            "",
            "Each scheme's pair (with and without memory) as its own group:",
            "",
            "| model | " + " | ".join(f"RECL r={r}" for r in results["r"]) + " |",
            "|---|" + "---:|" * len(results["r"]),
        ]
        for label in pairs:
            rows = by_label[label]
            cells = [
                _cell([row["pair_recl"][str(r)] for row in rows], longest) for r in results["r"]
            ]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join([*lines, ""])


def main() -> None:
    parser = options.parser(__doc__)
    parser.add_argument("--run", nargs=3, action="append", metavar=("LABEL", "WORKDIR", "MEM_LEN"))
    parser.add_argument("--config", default="configs/txl_small.py")
    parser.add_argument("--contexts", type=options.ints, default="0,32,64,128,256,512,1024")
    parser.add_argument("--tokens", type=int, default=32768)
    parser.add_argument("--segment", type=int, default=64)
    parser.add_argument(
        "--ablation", type=options.listed(choices=POSITIONS), metavar="A,B,...",
        help="schemes whose bench.ablation runs to use (+ memory 0)",
    )  # fmt: skip
    parser.add_argument("--seeds", type=options.ints, default="0", help="with --ablation")
    options.add_runs(parser, "runs/ablation", help="with --ablation")
    parser.add_argument("--mem-len", type=int, default=128, help="with --ablation")
    options.add_overrides(parser, help="with --ablation, as its runs had")
    options.add_out(parser)
    args = parser.parse_args()
    args.contexts = list(args.contexts)
    groups = groups_of(args)
    if not groups:
        raise SystemExit("bench.recl: no runs; pass --run LABEL WORKDIR MEM_LEN or --ablation")
    results = {
        "settings": sweep.settings(
            ["bench.recl", *sys.argv[1:]], tokens=args.tokens, segment=args.segment
        ),
        "contexts": args.contexts,
        "r": list(R_VALUES),
        "runs": [],
    }
    out = pathlib.Path(args.out)
    earlier = sweep.load(out / "recl.json")
    for seed, group in groups.items():
        rows = measured_before(earlier, results, seed, group)
        if rows is not None:
            print(f"seed {seed}: the group's RECL is in {out / 'recl.json'} already")
        results["runs"] += measure(args, seed, group) if rows is None else rows
        sweep.write(out / "recl.json", results)
    (out / "recl.md").write_text(render(results))
    print(render(results))


if __name__ == "__main__":
    main()
