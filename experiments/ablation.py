"""The Transformer-XL paper's Table 6 at small scale: every position scheme × {memory, no memory},
over seeds.

    .venv/bin/python -m experiments.ablation [--steps 500] [--schemes txl,shaw,...] [--seeds 0,1,2]
        [--mem-len 128] [--set model.n_layers=12 ...]   # any config override, applied to every run
        [--half-loss sinusoid]                          # also trained without memory on half loss
        [--dry-run]                                     # list the runs' command lines, run nothing

Trains ``configs/<scheme>_small.py`` (txl_small's sizes, data and hyperparameters; only the position
scheme differs) with memory (``--mem-len``, 128) and with ``mem_len`` 0, equal steps, on the
embedded pystdlib corpus, each seed once: ``train.py`` then ``eval.py --splits test`` (every test
token once, memory as trained). Each scheme of ``--half-loss`` is also trained without memory on
Dai et al.'s "half loss" (``train.loss_from`` = half the segment: the absolute encodings of their
Table 6 never train on positions with little context), its row ``<scheme>+half``. Finished runs
under ``--runs`` are reused, so a stopped sweep goes
on where it stopped, and so are the runs that ``ablation.json`` in ``--out`` already holds for the
same steps and overrides (their folders gone: another machine, a cleaned disk). Writes
``ablation.json`` (settings, commit, each run's test bpc; its test windows in
``ablation_windows.npz``; with ``--half-loss``, the windows of the runs without memory on the latter
half of each segment, ``experiments.latter_half_scoring``) and renders ``ablation.md`` (mean [95 %
bootstrap interval] over seeds and test windows, or mean ± sd for runs recorded without windows; the paper's WikiText-103
perplexities beside for reference; which differences are beyond chance: a paired interval that
excludes zero, or twice the spread — ``compare.Compare``), ``ablation.png`` and ``ablation_positions.png``
(test bpc against position in the segment, with and without memory) from it.
"""

from __future__ import annotations

import math
import pathlib
import sys

from bench import args as options
from experiments import compare, latter_half_scoring, sweep
from experiments.common import config_file, config_for, label_order, overrides, run_name
from relpos_jax.config import POSITIONS

# Dai et al. 2019, Table 6 (WikiText-103 test perplexity, 128M parameters, trained at length 128):
# PPL init (the trained attention length), PPL best, Attn Len (the shortest length reaching best),
# and the model a row names
TABLE6 = {
    ("txl", True): ("27.02", "26.77", "500", ""),
    ("shaw", True): ("27.94", "27.94", "256", ""),
    ("txl+half", True): ("28.69", "28.33", "460", ""),
    ("txl", False): ("29.59", "29.02", "260", ""),
    ("txl+half", False): ("30.10", "30.10", "120", ""),
    ("shaw", False): ("29.75", "29.75", "120", ""),
    ("shaw+half", False): ("30.50", "30.50", "120", ""),
    ("sinusoid+half", False): ("30.97", "30.97", "120", "Vaswani et al."),
    ("learned+half", False): ("31.16", "31.16", "120", "Al-Rfou et al."),
}
PAPER = {  # the test perplexity beside each row of the ablation: Table 6's init
    key: init + (f" ({model}, half loss)" if model else "")
    for key, (init, _, _, model) in TABLE6.items()
}
HALF = "+half"  # the row of a scheme trained on half loss (``--half-loss``)
LATTER_HALF = "latter_half_windows"  # a run's windows on the latter half of each segment


def _run_name(label: str, mem_len: int, seed: int) -> str:
    """A run's name from its row label (``sinusoid+half`` -> ``sinusoid_half_mem0_seed0``)."""
    return run_name(label.replace(HALF, "_half"), mem_len, seed)


def latter_half(run: dict) -> float | None:
    """A run's test bpc over the latter half of each segment (the positions a half-loss model
    trained on, each with half a segment of context or more): from its windows there
    (``experiments.latter_half_scoring``), else the mean of its bpc by position there."""
    windows = run.get(LATTER_HALF)
    if compare.has_windows(windows):
        return math.fsum(windows["bits"]) / math.fsum(windows["tokens"])
    by_position = run.get("bpc_by_position")
    if not by_position:
        return None
    half = by_position[len(by_position) // 2 :]
    return sum(half) / len(half)


def latter_halves(runs: list[dict]) -> tuple[list[float], list]:
    """Each run's ``latter_half`` bpc and its windows there (None where not kept), for the runs
    that have one."""
    found = [
        (value, run.get(LATTER_HALF)) for run in runs if (value := latter_half(run)) is not None
    ]
    return [v for v, _ in found], [w for _, w in found]


def _half_loss_lines(results: dict) -> list[str]:
    """The rows without memory on the positions a half-loss model trained on (none without one)."""
    if not any(run["scheme"].endswith(HALF) for run in results["runs"]):
        return []
    by_scheme: dict[str, list[dict]] = {}
    for run in results["runs"]:
        if run["memory"] == 0:
            by_scheme.setdefault(run["scheme"], []).append(run)
    halves = {scheme: latter_halves(runs) for scheme, runs in by_scheme.items()}
    halves = {scheme: found for scheme, found in halves.items() if found[0]}
    rule = compare.Compare({s: v for s, (v, _) in halves.items()},
                           {s: w for s, (_, w) in halves.items()})  # fmt: skip
    lines = [
        "A half-loss model never trained on the first half of a segment, which the test bpc above "
        f"scores too; on the latter half ({rule.summary_rule}: each run's test split scored "
        "again counting only the targets at offset half a segment or more, "
        "`experiments.latter_half_scoring`), where every model without memory sees half a "
        "segment of context or more:",
        "",
        "| scheme | memory | test bpc, latter half of each segment |",
        "|---|---:|---:|",
    ]
    for scheme in sorted(halves, key=rule.mean):
        lines.append(f"| {scheme} | 0 | {rule.cell(scheme, 4)} |")
    return [*lines, ""]


def runs_of(args) -> dict[tuple[str, int, int], sweep.Run]:
    """The sweep's runs by (scheme, memory, seed)."""
    runs = {}
    for scheme in args.schemes:
        for mem_len in (args.mem_len, 0):
            for seed in args.seeds:
                name = run_name(scheme, mem_len, seed)
                runs[scheme, mem_len, seed] = sweep.Run(
                    name=name, workdir=pathlib.Path(args.runs) / name, config=config_file(scheme),
                    settings=(
                        f"train.steps={args.steps}", f"train.eval_every={args.eval_every}",
                        *overrides(mem_len, seed, args.set),
                    ),
                )  # fmt: skip
    for scheme in getattr(args, "half_loss", ()):  # (the extrapolation sweep reuses runs_of)
        loss_from = config_for(scheme, 0, 0, args.set).data.segment_len // 2
        for seed in args.seeds:
            name = _run_name(scheme + HALF, 0, seed)
            runs[scheme + HALF, 0, seed] = sweep.Run(
                name=name, workdir=pathlib.Path(args.runs) / name, config=config_file(scheme),
                settings=(
                    f"train.steps={args.steps}", f"train.eval_every={args.eval_every}",
                    f"train.loss_from={loss_from}", *overrides(0, seed, args.set),
                ),
            )  # fmt: skip
    return runs


def _groups(results: dict) -> dict[tuple[str, int], list[float]]:
    """Test bpc of each (scheme, memory), over its seeds."""
    groups: dict[tuple[str, int], list[float]] = {}
    for run in results["runs"]:
        groups.setdefault((run["scheme"], run["memory"]), []).append(run["test_bpc"])
    return groups


def _compare(results: dict) -> compare.Compare:
    """The groups' test bpc and, where every run kept them, their test windows (``compare.Compare``
    picks the rule)."""
    windows: dict[tuple[str, int], list] = {}
    for run in results["runs"]:
        windows.setdefault((run["scheme"], run["memory"]), []).append(run.get("test_windows"))
    return compare.Compare(_groups(results), windows)


def render(results: dict) -> str:
    s, compare = results["settings"], _compare(results)
    groups = compare.values
    order = sorted(groups, key=compare.mean)
    lines = [
        "# Scheme × memory ablation (the Transformer-XL paper's Table 6, small scale)",
        "",
        f"Command: `{s['command']}`  ",
        f"Commit {s['commit']}, {s['machine']}, {s['date']}. Every run: {s['steps']} steps, "
        f"memory {s['mem_len']} or 0, seeds {', '.join(map(str, s['seeds']))}; test bpc over the "
        f"whole test split, memory carried as trained; {compare.summary_rule}.",
        "",
        "| scheme | memory | test bpc | seeds | paper (WikiText-103 test ppl) |",
        "|---|---:|---:|---:|---|",
    ]
    for scheme, memory in order:
        lines.append(
            f"| {scheme} | {memory} | {compare.cell((scheme, memory), 4)} | "
            f"{len(groups[scheme, memory])} | {PAPER.get((scheme, memory > 0), '')} |"
        )
    lines += ["", f"Differences {compare.difference_rule} (lower bpc is better):", ""]
    found = []
    for a, b in compare.in_ranking(order):
        found.append(f"- {a[0]} (memory {a[1]}) lower than {b[0]} (memory {b[1]}), next in the "
                     f"ranking{compare.difference_text(a, b, 4)}")  # fmt: skip
    for scheme in dict.fromkeys(key[0] for key in order):
        with_memory, without = (scheme, s["mem_len"]), (scheme, 0)
        if with_memory in groups and without in groups and compare.apart(with_memory, without):
            delta = compare.mean(with_memory) - compare.mean(without)
            found.append(f"- {scheme}: memory {'lowers' if delta < 0 else 'raises'} test bpc "
                         f"by {abs(delta):.4f}{compare.difference_text(with_memory, without, 4)}")  # fmt: skip
    reused = sweep.commits_lines(s, results["runs"], _name)
    lines += [
        *(found or ["- none"]),
        *sweep.missing_lines(s),
        *(["", *reused] if reused else []),
        "",
    ]
    return "\n".join(lines + _half_loss_lines(results) + _growth(results))


def _name(run: dict) -> str:
    return _run_name(run["scheme"], run["memory"], run["seed"])


def _eval_tokens(args) -> int:
    """The valid tokens that each validation during training scores (``train.eval_tokens``)."""
    return int(config_for("txl", args.mem_len, 0, args.set).train.eval_tokens)


def _growth(results: dict) -> list[str]:
    """Memory's effect on valid bpc at each validation step (memory − none, mean over seeds, and
    whether it exceeds twice the spread): the lines of that table, none without such steps."""
    mem_len, curves = results["settings"]["mem_len"], {}
    for run in results["runs"]:
        for step, bpc in run.get("valid_by_step") or []:
            curves.setdefault((run["scheme"], run["memory"], step), []).append(bpc)
    steps = sorted({step for _, _, step in curves})
    schemes = [s for s in dict.fromkeys(r["scheme"] for r in results["runs"])
               if all((s, m, t) in curves for m in (mem_len, 0) for t in steps)]  # fmt: skip
    if len(steps) < 2 or not schemes:
        return []
    tokens = results["settings"].get("eval_tokens")
    lines = [
        f"Memory's effect as training grows: valid bpc with memory {mem_len} minus without, at each "
        f"validation during training ({f'the first {tokens:,} valid tokens' if tokens else 'valid'}; "
        "at the last step the whole valid split; the learning rate still decays after each; * where "
        "the difference exceeds twice the larger spread over seeds):",
        "",
        "| scheme | " + " | ".join(f"step {step:,}" for step in steps) + " |",
        "|---|" + "---:|" * len(steps),
    ]
    for scheme in schemes:
        cells = []
        for step in steps:
            with_memory, without = curves[scheme, mem_len, step], curves[scheme, 0, step]
            delta = compare.mean_sd(with_memory)[0] - compare.mean_sd(without)[0]
            cells.append(f"{delta:+.4f}{' *' if compare.apart(with_memory, without) else ''}")
        lines.append(f"| {scheme} | " + " | ".join(cells) + " |")
    return [*lines, ""]


def plot(results: dict, path: pathlib.Path) -> None:
    from matplotlib.figure import Figure

    groups = _groups(results)
    summary = {key: compare.mean_sd(values) for key, values in groups.items()}
    fig = Figure(figsize=(7, 3.6), layout="constrained")
    ax = fig.add_subplot()
    schemes = sorted({s for s, _ in groups}, key=label_order)
    width = 0.4
    for i, mem_len in enumerate(sorted({m for _, m in groups}, reverse=True)):
        stats = [summary.get((s, mem_len), (float("nan"), 0.0)) for s in schemes]
        xs = [k + (i - 0.5) * width for k in range(len(schemes))]
        ax.bar(xs, [m for m, _ in stats], width, yerr=[sd for _, sd in stats],
               label=f"memory {mem_len}", capsize=2)  # fmt: skip
    ax.set_xticks(range(len(schemes)), schemes)
    ax.set_ylabel("test bpc, mean ± sd over seeds")
    means = [m for m, _ in summary.values()]
    ax.set_ylim(min(means) - 0.1, max(means) + 0.05)
    ax.legend()
    fig.savefig(path, dpi=120)


def plot_positions(results: dict, path: pathlib.Path) -> None:
    """Test bpc against position in the segment, with and without memory, a panel per scheme (mean
    over seeds): memory in use lowers the first positions most, where the segment alone holds the
    least context."""
    from matplotlib.figure import Figure

    curves: dict[tuple[str, int], list[list[float]]] = {}
    for run in results["runs"]:
        if run.get("bpc_by_position"):
            curves.setdefault((run["scheme"], run["memory"]), []).append(run["bpc_by_position"])
    schemes = sorted({s for s, _ in curves}, key=label_order)
    if not schemes:
        return
    columns = min(4, len(schemes))
    rows = -(-len(schemes) // columns)
    fig = Figure(figsize=(3 * columns, 2.4 * rows), layout="constrained")
    axes = fig.subplots(rows, columns, sharex=True, sharey=True, squeeze=False).ravel()
    for ax, scheme in zip(axes, schemes, strict=False):
        for memory in sorted({m for s, m in curves if s == scheme}, reverse=True):
            runs = curves[scheme, memory]
            mean = [sum(values) / len(values) for values in zip(*runs, strict=True)]
            ax.plot(range(1, len(mean) + 1), mean, label=f"memory {memory}")
        ax.set_title(scheme, fontsize=9)
        ax.legend(fontsize=7)
    for ax in axes[len(schemes) :]:
        ax.set_visible(False)
    fig.supxlabel("position in the segment")
    fig.supylabel("test bpc, mean over seeds")
    fig.savefig(path, dpi=120)


def _latter_half_windows(run: sweep.Run, mem_len: int, args) -> dict | None:
    """A run's windows on the latter half of each segment, in blocks, where the sweep has half-loss
    rows to compare it with (runs without memory only)."""
    if mem_len or not args.half_loss:
        return None
    found = latter_half_scoring.windows(run)
    return None if found is None else compare.in_blocks(found)


def add_run_options(parser) -> None:
    """The options that name the sweep's runs (``runs_of``): ``--steps``, ``--schemes``, ``--seeds``,
    ``--mem-len``, ``--half-loss``; the sweeps that score its runs take them too."""
    parser.add_argument("--steps", type=int, default=500)
    options.add_schemes(parser, POSITIONS)
    parser.add_argument("--seeds", type=options.ints, default="0,1,2", help="train.seed values")
    parser.add_argument("--mem-len", type=int, default=128, help="the memory runs' mem_len")
    parser.add_argument(
        "--half-loss", type=options.listed(choices=POSITIONS), default="", metavar="A,B,...",
        help="schemes also trained without memory on half loss (Table 6's absolute encodings)",
    )  # fmt: skip


def main() -> None:
    parser = options.parser(__doc__)
    add_run_options(parser)
    parser.add_argument(
        "--eval-every", type=int, default=0,
        help="validate every N steps during training (train.eval_every): the table of memory's "
        "effect as training grows (default: only the final test)",
    )  # fmt: skip
    sweep.add_options(parser)
    options.add_runs(parser, "runs/ablation")
    options.add_out(parser, "docs/results")
    options.add_overrides(parser)
    args = parser.parse_args()
    out = pathlib.Path(args.out)
    runs = runs_of(args)
    reused = sweep.reusable(
        out / "ablation.json", runs, ("scheme", "memory", "seed"), args.steps,
        mem_len=args.mem_len, sets=list(args.set), eval_every=args.eval_every,
    )  # fmt: skip
    finished = sweep.finish({k: run for k, run in runs.items() if k not in reused}, args)
    if finished is None:  # --dry-run
        return
    runs, evaluated, missing = finished
    results = {
        "settings": sweep.settings(
            ["experiments.ablation", *sys.argv[1:]], steps=args.steps, mem_len=args.mem_len,
            seeds=list(args.seeds), schemes=list(args.schemes), sets=list(args.set),
            half_loss=list(args.half_loss),
            eval_every=args.eval_every, eval_tokens=_eval_tokens(args), missing=missing,
        ),
        "runs": [
            {"scheme": scheme, "memory": mem_len, "seed": seed, "workdir": str(run.workdir),
             "test_bpc": evaluated[run.name]["test"]["bpc"],
             "bpc_by_position": evaluated[run.name]["test"].get("bpc_by_position"),
             "test_windows": compare.windows_of(run.workdir, "test"),
             LATTER_HALF: _latter_half_windows(run, mem_len, args),
             "valid_by_step": sweep.validation_curve(run.workdir)}
            for (scheme, mem_len, seed), run in runs.items()
        ] + list(reused.values()),
    }  # fmt: skip
    sweep.write(out / "ablation.json", results)  # the windows beside it, in ablation_windows.npz
    (out / "ablation.md").write_text(render(results))
    plot(results, out / "ablation.png")
    plot_positions(results, out / "ablation_positions.png")
    print(render(results))


if __name__ == "__main__":
    main()
