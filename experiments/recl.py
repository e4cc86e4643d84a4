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

Writes ``recl.json`` after each group and renders ``recl.md`` from it
(``experiments.recl_tables``). A killed sweep goes on where it stopped: a group the JSON holds,
measured with the same settings and with every run's ``eval.json`` unchanged, is not measured
again. ``--dry-run`` lists the groups, their runs and how each is scored, and measures nothing. A
``recl.json`` of the earlier protocol (every run of the ablation in one group, doubling contexts,
every model scored with memory, no intervals) still renders, and says so.
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
from experiments.recl_tables import render
from relpos_jax.analysis.context_losses import MEMORY, scoring_for, trained_window
from relpos_jax.config import POSITIONS, load_config

R_VALUES = (0.1, 0.5, 1.0)
# recl.json's layout: fixed Δ, the group as given, scored as trained, intervals (2); absolute
# positions scored in windows of at most their trained length (3)
PROTOCOL = 3
PAPER_GROUP = "txl:M,shaw:M,txl:0,sinusoid:0"
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
        longest = trained_window(cfg)  # None for a model trained with memory
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
