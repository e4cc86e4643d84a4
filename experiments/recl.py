"""Relative effective context length (Transformer-XL §4.3, appendix C) of a group of trained runs.

    .venv/bin/python -m experiments.recl --ablation --runs runs/ablation --mem-len 64 --seeds 0,1,2 \\
        --set model.n_layers=4 ...        # the paper's group, from experiments.ablation's runs
    .venv/bin/python -m experiments.recl --ablation txl:M,shaw:M,t5:M,txl:0 ...   # another group
    .venv/bin/python -m experiments.recl --run "txl, memory 128" runs/cmp2k_mem128 128 \\
        --run "txl, memory 0" runs/cmp2k_mem0 0 [--config configs/txl_small.py]

RECL is a property of a model within its group (the baseline is the group's best loss per token).
``--ablation`` takes the group as ``scheme:memory`` items, memory ``M`` (``--mem-len``) or a number;
the default, ``paper``, is Table 8's group: ``txl:M,shaw:M,txl:0,sinusoid:0`` (Transformer-XL,
with Shaw et al.'s encoding, without recurrence, and a vanilla Transformer), experiments.ablation's runs
``{scheme}_mem{memory}_seed{seed}``, each seed its own group; a bare scheme means both of its runs
(``txl`` = ``txl:M,txl:0``). ``--run LABEL WORKDIR MEM_LEN`` groups take runs trained with memory
MEM_LEN.

Contexts c = ``--first``, + ``--delta``, … ``--longest`` (0, 32, …, 512). Each model is scored as it
was trained (``relpos_jax.analysis.context_losses``): with memory c if it was trained with memory,
else in fresh windows of c + s tokens scoring their last s; the same ``--tokens`` test tokens in
segments of s = ``--segment`` either way, so a token at offset j of its segment attends to c + j
earlier tokens in both. RECL for r = 0.1, 0.5, 1.0 with a percentile bootstrap over the tokens
(``--replicates``, blocks of ``--block`` tokens, default one segment; ``--bootstrap-seed``).

Writes ``recl.json`` after each group and renders ``recl.md`` from it. A killed sweep goes on where
it stopped: a group the JSON holds, measured with the same settings and with every run's
``eval.json`` unchanged, is not measured again. ``--dry-run`` lists the groups, their runs and how
each is scored, and measures nothing. A ``recl.json`` of the earlier protocol (every run of the
ablation in one group, doubling contexts, every model scored with memory, no intervals) still
renders, and says so.
"""

from __future__ import annotations

import json
import math
import pathlib
import shlex
import sys
from typing import NamedTuple

from bench import args as options
from bench.measure import ROOT
from experiments import sweep
from experiments.common import config_for, run_name
from relpos_jax.analysis.context_losses import MEMORY, WINDOW, scoring_for, trained_window
from relpos_jax.config import POSITIONS, load_config

R_VALUES = (0.1, 0.5, 1.0)
# recl.json's layout: fixed Δ, the group as given, scored as trained, intervals (2); absolute
# positions scored in windows of at most their trained length (3)
PROTOCOL = 3
PAPER_GROUP = "txl:M,shaw:M,txl:0,sinusoid:0"
PAPER = {  # Dai et al. 2019, Table 8 (WikiText-103, 128M models): RECL at r = 0.1 / 0.5 / 1.0
    ("txl", True): ("Transformer-XL 128M", "700 / 600 / 500"),
    ("shaw", True): ("with Shaw et al.'s encoding", "400 / 400 / 300"),
    ("txl", False): ("without recurrence", "300"),
    ("sinusoid", False): ("vanilla Transformer", "128"),
    ("learned", False): ("vanilla Transformer", "128"),
}
BATCH_ROWS = 16  # the rows the scored tokens are cut into (they fix which tokens are scored)


class Member(NamedTuple):
    """One run of a group: its label, scheme (None: a ``--run``), trained memory, config, folder."""

    label: str
    scheme: str | None
    mem_len: int
    config: object
    workdir: pathlib.Path


def parse_group(text: str, mem_len: int) -> list[tuple[str, int]]:
    """(scheme, trained memory) of each member of ``--ablation``'s group, in order."""
    members: list[tuple[str, int]] = []
    for item in (PAPER_GROUP if text == "paper" else text).split(","):
        scheme, _, memory = item.strip().partition(":")
        if scheme not in POSITIONS or (memory and memory != "M" and not memory.isdigit()):
            raise ValueError(
                f"experiments.recl: {item!r} in --ablation {text!r} is invalid; use scheme:M, "
                f"scheme:<memory> or a bare scheme, schemes from {','.join(POSITIONS)}"
            )
        memories = [mem_len, 0] if not memory else [mem_len if memory == "M" else int(memory)]
        for m in memories:
            if (scheme, m) in members:
                raise ValueError(f"experiments.recl: --ablation {text!r} names {scheme}:{m} twice")
            members.append((scheme, m))
    return members


def groups_of(args) -> dict[int | None, list[Member]]:
    """The groups by seed (None: the ``--run`` group)."""
    groups: dict[int | None, list[Member]] = {}
    for label, workdir, mem_len in args.run or ():
        config = load_config(ROOT / args.config, [f"model.mem_len={mem_len}"])
        groups.setdefault(None, []).append(
            Member(label, None, int(mem_len), config, ROOT / workdir)
        )
    for seed in args.seeds if args.ablation else ():
        for scheme, mem_len in args.group:
            groups.setdefault(seed, []).append(
                Member(
                    f"{scheme}, memory {mem_len}", scheme, mem_len,
                    config_for(scheme, mem_len, seed, args.set),
                    pathlib.Path(args.runs) / run_name(scheme, mem_len, seed),
                )
            )  # fmt: skip
    return groups


def measure(args, seed, group: list[Member]) -> list[dict]:
    """Each run of one group: its bpc at each context and its RECL (with intervals) in the group."""
    from relpos_jax import data
    from relpos_jax.analysis.recl import recl_intervals, scoring_losses
    from relpos_jax.evaluate import restore_model

    losses, rows = {}, []
    for member in group:
        model, cfg, step = restore_model(member.config, member.workdir)
        test = data.open_data(cfg.data, "test")
        scoring = scoring_for(member.mem_len)
        longest = trained_window(cfg) if scoring == WINDOW else None
        losses[member.label] = scoring_losses(
            model, test, args.contexts, scoring=scoring, segment_len=args.segment,
            n_tokens=args.tokens, batch_size=BATCH_ROWS, longest_window=longest,
        )  # fmt: skip
        bpc = {str(c): float(v.mean()) / math.log(2) for c, v in losses[member.label].items()}
        print(f"{member.label}, seed {seed} (step {step}, {scoring}):",
              {c: round(b, 4) for c, b in bpc.items()})  # fmt: skip
        rows.append({
            "label": member.label, "scheme": member.scheme, "seed": seed,
            "mem_len": member.mem_len, "scoring": scoring, "longest_window": longest, "bpc": bpc,
            "trained": trained(member.workdir),
        })  # fmt: skip
    b = args.bootstrap
    intervals = recl_intervals(
        losses, r_values=R_VALUES, level=b["level"], replicates=b["replicates"], seed=b["seed"],
        block=b["block"],
    )  # fmt: skip
    for row in rows:
        by_r = intervals[row["label"]]
        row["recl"] = {str(r): by_r[r].point for r in R_VALUES}
        row["recl_interval"] = {str(r): [by_r[r].lo, by_r[r].hi] for r in R_VALUES}
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
    group (its labels, of runs trained as they are now) with the same protocol, contexts, r,
    bootstrap, tokens and segment."""
    if (
        earlier is None
        or any(
            earlier.get(k) != settings.get(k) for k in ("protocol", "contexts", "r", "bootstrap")
        )
        or any(earlier["settings"].get(k) != settings["settings"][k] for k in ("tokens", "segment"))
    ):
        return None
    rows = [row for row in earlier["runs"] if row["seed"] == seed]
    if [row["label"] for row in rows] != [member[0] for member in group]:
        return None
    now = [trained(member[-1]) for member in group]
    if any(t is None or row.get("trained") != t for row, t in zip(rows, now, strict=True)):
        return None
    return rows


def dry_run(groups: dict, results: dict, earlier: dict | None, args) -> str:
    """What a run would do: each group's runs, how each is scored, and whether it is measured."""
    lines = [f"contexts {results['contexts']}, {args.tokens:,} tokens, segments of {args.segment}"]
    untrained = []
    for seed, group in groups.items():
        done = measured_before(earlier, results, seed, group) is not None
        lines.append(f"seed {seed}: " + ("in recl.json already" if done else "to measure"))
        for member in group:
            ready = (member.workdir / "checkpoints").exists()
            longest = trained_window(member.config)
            scored = ("with memory c" if scoring_for(member.mem_len) == MEMORY else "in windows"
                      + (f" of at most {longest} (absolute positions)" if longest else ""))  # fmt: skip
            lines.append(f"  {member.label}: {member.workdir} ({scored})"
                         + ("" if ready else ", not trained"))  # fmt: skip
            if not ready and member.scheme is not None:
                untrained.append(member.scheme)
    if untrained:
        command = ["python", "-m", "experiments.ablation", "--schemes", ",".join(dict.fromkeys(untrained)),
                   "--mem-len", str(args.mem_len), "--seeds", ",".join(map(str, args.seeds)),
                   "--runs", str(args.runs), *(f"--set={s}" for s in args.set)]  # fmt: skip
        lines.append(f"train the missing runs first: {shlex.join(command)}")
    return "\n".join(lines)


def _bounded(value: int, longest: int) -> str:
    return f"{'≥' if value >= longest else ''}{value}"


def _cell(values: list[float], longest: int, digits: int = 0) -> str:
    """Mean ± sd; "≥" where a seed's RECL reached the longest context (a lower bound)."""
    bound = "≥" if any(v >= longest for v in values) else ""
    return bound + sweep.mean_sd_text(values, digits)


def _interval(row: dict, r, longest: int) -> str:
    point, (lo, hi) = row["recl"][str(r)], row["recl_interval"][str(r)]
    return f"{_bounded(point, longest)} [{lo}, {_bounded(hi, longest)}]"


def _scored(row: dict) -> str:
    """How a row's model was scored: memory, windows, or windows of at most its trained length."""
    longest = row.get("longest_window")
    return f"{row['scoring']}s ≤ {longest}" if longest else row["scoring"]


def render(results: dict) -> str:
    if results.get("protocol") is None:
        return render_earlier(results)
    s, contexts, b = results["settings"], results["contexts"], results["bootstrap"]
    longest, seg = contexts[-1], s["segment"]
    by_label: dict[str, list[dict]] = {}
    for row in results["runs"]:
        by_label.setdefault(row["label"], []).append(row)
    members = "; ".join(by_label)
    shown = contexts if len(contexts) <= 4 else [*contexts[:3], "…", longest]
    steps = ", ".join(map(str, shown))
    r_head = " | ".join(f"RECL r={r}" for r in results["r"])
    capped = (
        " A model with absolute positions (*windows ≤ W*) is given windows of at most its "
        "training window W, as a vanilla Transformer is evaluated: it never trained on a position "
        "past W, so a longer window would score untrained positions, not unused context. Its "
        f"loss stops changing at c = W − {seg}."
    )
    lines = [
        "# Relative effective context length (Transformer-XL §4.3, appendix C)",
        "",
        f"Command: `{s['command']}`  ",
        f"Commit {s['commit']}, {s['machine']}, {s['date']}.",
        "",
        f"**The group**: {members}. RECL is a property of a model within its group, not of the "
        "model alone: at each context the baseline is the group's best loss on each token, so "
        "another group gives other numbers. The paper's Table 8 group is Transformer-XL, with Shaw "
        "et al.'s encoding, without recurrence and a vanilla Transformer (Al-Rfou et al.'s learned "
        "its positions; here sinusoids); its RECL is on WikiText-103 words with 128M models.",
        "",
        f"**Contexts** c = {steps} (Δ = {results['delta']}), the same {s['tokens']:,} test tokens "
        f"for every model and context, scored in segments of s = {seg}, each model as it was "
        "trained:",
        "",
        "- *memory* (trained with memory): a memory of c positions carried from segment to "
        "segment; a token at offset j of its segment attends to the c + j positions before it at "
        "every layer, and older text reaches it through the memory states (the recurrence it was "
        "trained with);",
        f"- *windows* (trained without memory): each segment of {seg} targets from a fresh window "
        f"of the c + {seg} tokens that end with it, no memory; a token at offset j sees exactly "
        "the c + j tokens before it." + (capped if results["protocol"] >= 3 else ""),
        "",
        f"Every token attends to between c and c + {seg - 1} earlier tokens in both; at c = 0 "
        "the two are the same evaluation. **RECL**: the first c whose step to c + Δ lowers the "
        "perplexity of the group's top-r hardest tokens (by the baseline) by less than 1%; ≥: "
        f"a model still gained at the longest context, {longest}, a lower bound. "
        f"[interval]: {b['level']:.0%} percentile bootstrap over the scored tokens in blocks of "
        f"{b['block']}, {b['replicates']:,} replicates, one draw for the whole group, seed "
        f"{b['seed']}.",
        "",
    ]
    several = any(len(rows) > 1 for rows in by_label.values())
    lines += [
        f"| model | scored | seeds | {r_head} | paper, Table 8 (r = 0.1 / 0.5 / 1.0) |",
        "|---|---|---:|" + "---:|" * len(results["r"]) + "---|",
    ]
    for label, rows in by_label.items():
        if several:
            cells = [_cell([row["recl"][str(r)] for row in rows], longest) for r in results["r"]]
        else:
            cells = [_interval(rows[0], r, longest) for r in results["r"]]
        name, values = PAPER.get((rows[0]["scheme"], rows[0]["mem_len"] > 0), ("", ""))
        paper = f"{name}: {values}" if name else ""
        lines.append(
            f"| {label} | {_scored(rows[0])} | {len(rows)} | {' | '.join(cells)} | {paper} |"
        )
    if several:
        lines += [
            "",
            "RECL above: mean ± sd over the seeds, each seed's runs one group. Each seed's RECL "
            "[interval]:",
            "",
            f"| model | seed | {r_head} |",
            "|---|---:|" + "---:|" * len(results["r"]),
        ]
        for label, rows in by_label.items():
            for row in rows:
                cells = [_interval(row, r, longest) for r in results["r"]]
                lines.append(f"| {label} | {row['seed']} | {' | '.join(cells)} |")
    lines += [
        "",
        "Test bpc at each context, mean over seeds:",
        "",
        "| c | " + " | ".join(by_label) + " |",
        "|---:|" + "---:|" * len(by_label),
    ]
    for c in contexts:
        cells = [f"{sum(row['bpc'][str(c)] for row in rows) / len(rows):.4f}"
                 for rows in by_label.values()]  # fmt: skip
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    return "\n".join([*lines, ""])


def render_earlier(results: dict) -> str:
    """A ``recl.json`` of the earlier protocol, as it was rendered, with what that protocol was."""
    s, contexts = results["settings"], results["contexts"]
    longest = contexts[-1]
    by_label: dict[str, list[dict]] = {}
    for row in results["runs"]:
        by_label.setdefault(row["label"], []).append(row)
    lines = [
        "# Relative effective context length (Transformer-XL, appendix C)",
        "",
        f"Command: `{s['command']}`  ",
        f"Commit {s['commit']}, {s['machine']}, {s['date']}. **The earlier protocol**, not the "
        "paper's: the group is every run listed (an oracle baseline, not Table 8's group), the "
        "contexts double instead of stepping by a fixed Δ, every model is scored with memory = c "
        "(same_length) whether or not it was trained with memory, and there are no intervals; "
        "`python -m experiments.recl --ablation` measures the paper's protocol.",
        "",
        f"The same {s['tokens']:,} test tokens "
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


def parse(argv: list[str] | None = None):
    """The command line's options, with ``contexts`` (the fixed-Δ grid) and ``bootstrap`` added;
    one argparse error for an invalid grid or group."""
    from relpos_jax.analysis.bootstrap import LEVEL, REPLICATES
    from relpos_jax.analysis.recl import fixed_grid

    parser = options.parser(__doc__)
    parser.add_argument("--run", nargs=3, action="append", metavar=("LABEL", "WORKDIR", "MEM_LEN"))
    parser.add_argument("--config", default="configs/txl_small.py", help="with --run")
    parser.add_argument(
        "--ablation", nargs="?", const="paper", metavar="GROUP",
        help=f"experiments.ablation's runs as a group: paper ({PAPER_GROUP}, the default) or "
        "scheme:memory items, memory M (--mem-len) or a number; a bare scheme: both its runs",
    )  # fmt: skip
    parser.add_argument("--first", type=int, default=0, help="the shortest context c")
    parser.add_argument("--delta", type=int, default=32, help="the step Δ between contexts")
    parser.add_argument("--longest", type=int, default=512, help="the longest context")
    parser.add_argument("--tokens", type=int, default=32768, help="test tokens scored")
    parser.add_argument("--segment", type=int, default=64, help="s: tokens scored per segment")
    parser.add_argument("--replicates", type=int, default=REPLICATES, help="bootstrap replicates")
    parser.add_argument("--block", type=int, help="tokens per resampled block (default: --segment)")
    parser.add_argument("--bootstrap-seed", type=int, default=0)
    parser.add_argument("--seeds", type=options.ints, default="0", help="with --ablation")
    options.add_runs(parser, "runs/ablation", help="with --ablation")
    parser.add_argument("--mem-len", type=int, default=128, help="M, with --ablation")
    options.add_overrides(parser, help="with --ablation, as its runs had")
    parser.add_argument("--dry-run", action="store_true", help="list the groups, measure nothing")
    options.add_out(parser, "docs/results")
    args = parser.parse_args(argv)
    try:
        args.contexts = fixed_grid(args.delta, args.longest, args.first)
        if args.ablation:
            args.group = parse_group(args.ablation, args.mem_len)
    except ValueError as error:
        parser.error(str(error))
    if not (args.ablation or args.run):
        parser.error("no runs; pass --ablation [GROUP] or --run LABEL WORKDIR MEM_LEN")
    args.bootstrap = {"replicates": args.replicates, "level": LEVEL, "seed": args.bootstrap_seed,
                      "block": args.block or args.segment}  # fmt: skip
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    groups = groups_of(args)
    results = {
        "settings": sweep.settings(
            ["experiments.recl", *(sys.argv[1:] if argv is None else argv)], tokens=args.tokens,
            segment=args.segment,
            group=",".join(f"{s}:{m}" for s, m in args.group) if args.ablation else None,
        ),
        "protocol": PROTOCOL,
        "contexts": args.contexts,
        "delta": args.delta,
        "r": list(R_VALUES),
        "bootstrap": args.bootstrap,
        "runs": [],
    }  # fmt: skip
    out = pathlib.Path(args.out)
    earlier = sweep.load(out / "recl.json")
    if args.dry_run:
        print(dry_run(groups, results, earlier, args))
        return
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
