"""Memory probes over seeds: can a scheme answer beyond its segment with memory, and can it answer
at all (the key inside the segment)? Accuracy against distance.

    .venv/bin/python -m experiments.probes [--config configs/probe_needle.py] [--schemes txl,alibi,...]
        [--conditions memory,in_segment,no_memory] [--seeds 0,1,2,3,4,5,6,7] [--steps N]
        [--distances 8,16,...] [--set model.n_layers=1 ...] [--dry-run]

Each (scheme, condition, seed) is one ``train.py`` + ``eval.py`` run of the probe config (a
``experiments.sweep`` run: reused when finished, listed by ``--dry-run``), then scored on fresh test
documents at each distance (``relpos_jax.analysis.probing.accuracy_by_distance``: teacher-forced,
segment and memory as in training; cached in the run's ``probe_accuracy.json``). The conditions:

- ``memory``: the config's segment and memory (needle: 16 + 48, so most keys lie in memory);
- ``in_segment``: one segment as long as that window (64) and no memory, the batch shrunk so that a
  step holds the same tokens, scored only where the key is inside the segment (as rows run on, a
  key d bytes back falls in the segment before for about d/64 of the answers, beyond a model
  without memory: ``probing.within_reach``). A scheme that fails here cannot do the lookup in this
  budget at all, so its failure with memory says nothing about memory;
- ``no_memory``: the config's segment without memory (chance beyond the segment).

The distances scored are the trained ones by default (those the probe config's documents draw:
8 … 48 for the needle config); ``--distances`` beyond them ask whether the lookup extrapolates,
and the table marks them. A seed **solves** the probe when its accuracy averaged over the trained
distances is at least ``probe_solved.SOLVED``: the lookup is learnt or not, so a mean over seeds
that mixes solved and unsolved seeds says little, and the table leads with the share of seeds that
solve it, its exact interval, whether memory's share and the segment's differ, and the seeds that
learnt it in part.

Writes ``<config>.json`` (settings, commit, every seed's curve) and renders ``<config>.md`` (seeds
that solve it, mean ± sd over seeds at each distance, what differs from chance beyond twice the
spread) and ``<config>.png`` from it. A run whose folder is gone (another machine, a cleaned disk)
but which that JSON already holds with the same steps, overrides, segment, memory and distances
is reused, not trained again; the table names the commit it was measured at.
"""

from __future__ import annotations

import json
import pathlib
import sys

from bench import args as options
from bench.measure import ROOT
from experiments import compare, probe_solved, sweep
from experiments.common import PROBE_SCHEMES
from experiments.probe_solved import label
from relpos_jax.config import Config, load_config
from relpos_jax.files import replace_whole

CONDITIONS = ("memory", "in_segment", "no_memory")


def condition_settings(condition: str, cfg: Config) -> tuple[str, ...]:
    """The config overrides that make ``condition`` of the probe config ``cfg``."""
    segment, memory, batch = cfg.data.segment_len, cfg.model.mem_len, cfg.data.batch_size
    if condition == "memory":
        return ()
    if condition == "no_memory":
        return ("model.mem_len=0",)
    window = segment + memory
    if batch * segment % window:
        raise SystemExit(
            f"experiments.probes: in_segment needs batch·segment ({batch}·{segment}) divisible by the "
            f"window {window}; pass --set data.batch_size=... accordingly"
        )
    return (
        f"data.segment_len={window}",
        "model.mem_len=0",
        f"data.batch_size={batch * segment // window}",
    )


def runs_of(args, cfg: Config) -> dict[tuple[str, str, int], sweep.Run]:
    """The sweep's runs by (scheme, condition, seed)."""
    stem, runs = pathlib.Path(args.config).stem, {}
    for scheme in args.schemes:
        for condition in args.conditions:
            for seed in args.seeds:
                name = f"{stem}_{scheme}_{condition}_seed{seed}"
                settings = (
                    f"train.steps={args.steps}", f"train.seed={seed}", f"model.position={scheme}",
                    *args.set, *condition_settings(condition, cfg),  # (cfg has --set applied)
                )  # fmt: skip
                runs[scheme, condition, seed] = sweep.Run(
                    name, pathlib.Path(args.runs) / name, args.config, settings
                )
    return runs


def score(
    run: sweep.Run, distances, window: tuple[int, int] | None = None, reachable_only: bool = False
) -> list[dict]:
    """The run's accuracy at each distance, with its own segment and memory or ``window`` (segment,
    memory) instead, over every answer or (``reachable_only``) those whose key is within reach;
    cached in the run's ``probe_accuracy*.json``."""
    from relpos_jax.analysis.probing import accuracy_by_distance
    from relpos_jax.data import probes
    from relpos_jax.evaluate import restore_model

    suffix = "" if window is None else f"_seg{window[0]}_mem{window[1]}"
    cache = run.workdir / f"probe_accuracy{suffix}.json"
    if cache.exists():
        cached = json.loads(cache.read_text())
        same = [c["distance"] for c in cached] == list(distances)
        if same and _scored_as(cached, reachable_only):
            return cached
    cfg = load_config(ROOT / run.config, list(run.settings))
    kind, *_ = probes.parse(cfg.data.name)
    model, c, _ = restore_model(cfg, run.workdir)
    segment_len, mem_len = window or (c.data.segment_len, c.model.mem_len)
    curve = accuracy_by_distance(
        model, kind, distances, segment_len=segment_len, mem_len=mem_len, documents=256,
        reachable_only=reachable_only,
    )  # fmt: skip
    text = json.dumps(curve, indent=1) + "\n"
    replace_whole(cache, lambda f: f.write(text.encode()))
    return curve


def _scored_as(curve: list[dict], reachable_only: bool) -> bool:
    """Whether every point of ``curve`` was scored over the answers ``reachable_only`` names (every
    answer, for points written before that choice)."""
    return all(point.get("reachable_only", False) == reachable_only for point in curve)


def _curves(results: dict, field: str = "curve") -> dict[tuple[str, str], dict[int, list[float]]]:
    """Accuracy of each (scheme, condition) by distance, over its seeds (runs without ``field``
    left out)."""
    curves: dict[tuple[str, str], dict[int, list[float]]] = {}
    for run in results["runs"]:
        if field not in run:
            continue
        by_distance = curves.setdefault((run["scheme"], run["condition"]), {})
        for point in run[field]:
            if point["byte_accuracy"] is not None:  # None: no answer within reach
                by_distance.setdefault(point["distance"], []).append(point["byte_accuracy"])
    return curves


def trained_distances(probe_name: str, step: int = 8) -> list[int]:
    """The distances a probe config trains on, every ``step`` bytes from its shortest to its
    longest (``probe:needle:8-48`` → 8, 16, …, 48)."""
    from relpos_jax.data import probes

    _, shortest, longest = probes.parse(probe_name)
    return sorted({*range(shortest, longest + 1, step), longest})


def _label_of(run: dict) -> str:
    return label(run["scheme"], run["condition"])


def render(results: dict) -> str:
    s, curves = results["settings"], _curves(results)
    chance = results["chance"]
    distances = sorted({d for curve in curves.values() for d in curve})
    lines = [
        f"# The {s['kind']} probe: accuracy against distance, over seeds",
        "",
        f"Command: `{s['command']}`  ",
        f"Commit {s['commit']}, {s['machine']}, {s['date']}. Config `{s['config']}`: segment "
        f"{s['segment_len']}, memory {s['mem_len']}, {s['steps']} steps, seeds "
        f"{', '.join(map(str, s['seeds']))}. Conditions: memory (the config's segment and memory), "
        f"in segment ({s['segment_len'] + s['mem_len']}-byte segments, no memory, the same tokens a "
        f"step; {_in_segment_scoring(results)}), no memory (the config's segment alone). "
        f"Answer-byte accuracy on 256 fresh test documents a distance, teacher-forced, mean ± sd "
        f"over the seeds; chance is {chance}.{_untrained_note(s, distances)}",
        *probe_solved.solved_lines(results),
        "",
        *_table(curves, distances, s.get("trained")),
    ]
    lines += _above_chance(curves, distances, chance) + sweep.missing_lines(s)
    read = _curves(results, "curve_with_memory")
    if read:
        lines += [
            "",
            f"The in-segment models (trained without memory) scored with the memory runs' segment "
            f"{s['segment_len']} and memory {s['mem_len']}, where every needle lies within the "
            "window: if a model that learned the lookup in its segment answers here too, the "
            "forward pass through memory is sound and a failure of the memory runs is one of "
            "training.",
            "",
            *_table(read, distances, s.get("trained")),
            *_above_chance(read, distances, chance),
        ]
    reused = sweep.commits_lines(s, results["runs"], _label_of, seed=lambda run: run["seed"])
    return "\n".join([*lines, *(["", *reused] if reused else []), ""])


def _in_segment_scoring(results: dict) -> str:
    """Which in-segment answers were scored: those whose key lies inside the segment (with their
    share at the shortest and the longest distance), or, in a JSON written before that choice,
    every answer."""
    points = [p for r in results["runs"] if r["condition"] == "in_segment" for p in r["curve"]]
    if not points or not _scored_as(points, True):
        return "scored at every answer, also those whose key falls in the segment before"
    shares = {p["distance"]: p["reachable"] for p in points}
    low, high = min(shares), max(shares)
    return (
        f"scored only where the key is inside the segment: {shares[low]:.0%} of the answers at "
        f"distance {low}, {shares[high]:.0%} at {high}; the others' keys fall in the segment before"
    )


def _above_chance(curves: dict, distances: list[int], chance: float) -> list[str]:
    found = []
    for key, curve in curves.items():
        above = [d for d in distances if d in curve and _above(curve[d], chance)]
        if above:
            found.append(f"- {label(*key)}: at {', '.join(map(str, above))}")
    head = ["", "Above chance by more than twice the spread (and more than 0.05):", ""]
    return head + (found or ["- none"])


def _untrained_note(s: dict, distances: list[int]) -> str:
    if "trained" not in s:
        return ""
    low, high = s["trained"]
    if all(low <= d <= high for d in distances):
        return f" Every distance is one the model was trained on ({low}–{high})."
    return f" Distances marked * lie outside the trained range {low}–{high} (extrapolation)."


def _table(curves: dict, distances: list[int], trained=None) -> list[str]:
    low, high = trained or (min(distances, default=0), max(distances, default=0))
    lines = [
        "| distance | " + " | ".join(label(*key) for key in curves) + " |",
        "|---:|" + "---:|" * len(curves),
    ]
    for d in distances:
        cells = [compare.mean_sd_text(curve.get(d, []), 3) for curve in curves.values()]
        mark = "" if low <= d <= high else "*"
        lines.append(f"| {d}{mark} | " + " | ".join(cells) + " |")
    return lines


def _above(values: list[float], chance: float) -> bool:
    mean, sd = compare.mean_sd(values)
    return len(values) > 1 and mean - chance > max(2 * sd, 0.05)


def plot(results: dict, path: pathlib.Path) -> None:
    from matplotlib.figure import Figure

    s, curves = results["settings"], _curves(results)
    fig = Figure(figsize=(7, 4), layout="constrained")
    ax = fig.add_subplot()
    for key, curve in curves.items():
        distances = sorted(curve)
        stats = [compare.mean_sd(curve[d]) for d in distances]
        ax.errorbar(distances, [m for m, _ in stats], yerr=[sd for _, sd in stats], marker="o",
                    capsize=2, label=label(*key))  # fmt: skip
    ax.axhline(results["chance"], color="grey", ls=":", label="chance")
    ax.axvline(s["segment_len"], color="k", lw=0.8, ls="--", label="segment")
    ax.axvline(
        s["segment_len"] + s["mem_len"], color="k", lw=0.8, ls="-.", label="segment + memory"
    )
    ax.set(xlabel="distance to the key (bytes)", ylabel="answer-byte accuracy", ylim=(0, 1.02))
    ax.set_title(f"{s['kind']} probe, mean ± sd over seeds")
    ax.legend(fontsize=7)
    fig.savefig(path, dpi=120)


def _reused(path: pathlib.Path, runs: dict, args, cfg: Config) -> dict[tuple, dict]:
    """The runs of ``runs`` whose folder here has not finished but which the sweep's earlier JSON at
    ``path`` holds with the same steps, overrides, segment, memory and distances: reused (with the
    commit they were measured at) instead of trained again."""
    earlier = sweep.reusable(
        path, runs, ("scheme", "condition", "seed"), args.steps, sets=list(args.set),
        segment_len=cfg.data.segment_len, mem_len=cfg.model.mem_len,
    )  # fmt: skip
    distances = list(args.distances)
    return {
        (scheme, condition, seed): run
        for (scheme, condition, seed), run in earlier.items()
        if [point["distance"] for point in run["curve"]] == distances
        and _scored_as(run["curve"], reachable_only=condition == "in_segment")
    }


def main() -> None:
    parser = options.parser(__doc__)
    parser.add_argument("--config", default="configs/probe_needle.py")
    parser.add_argument("--steps", type=int, default=None, help="default: the config's")
    parser.add_argument(
        "--distances", type=options.ints, default=None,
        help="default: the trained ones, every 8 bytes of the probe config's range",
    )  # fmt: skip
    options.add_schemes(parser, PROBE_SCHEMES)
    parser.add_argument(
        "--conditions", type=options.listed(choices=CONDITIONS), default="memory,in_segment",
        help=f"from {','.join(CONDITIONS)} (default: %(default)s)",
    )  # fmt: skip
    parser.add_argument(
        "--seeds", type=options.ints, default="0,1,2,3,4,5,6,7",
        help="train.seed values (the lookup is learnt or not: 6–8 seeds give its share)",
    )  # fmt: skip
    sweep.add_options(parser)
    options.add_out(parser, "docs/results")
    options.add_runs(parser, "runs/probes")
    options.add_overrides(parser, help="e.g. model.n_layers=1")
    args = parser.parse_args()

    cfg = Config.from_any(load_config(ROOT / args.config, args.set))
    args.steps = args.steps or cfg.train.steps
    args.distances = args.distances or trained_distances(cfg.data.name)
    out, stem = pathlib.Path(args.out), pathlib.Path(args.config).stem
    every = runs_of(args, cfg)
    reused = _reused(out / f"{stem}.json", every, args, cfg)
    finished = sweep.finish({k: run for k, run in every.items() if k not in reused}, args)
    if finished is None:  # --dry-run
        return
    runs, _, missing = finished
    from relpos_jax.data import probes

    kind, shortest, longest = probes.parse(cfg.data.name)
    memory_window = (cfg.data.segment_len, cfg.model.mem_len)
    measured = {
        (scheme, condition, seed): {
            "scheme": scheme, "condition": condition, "seed": seed, "workdir": str(run.workdir),
            "curve": score(run, args.distances, reachable_only=condition == "in_segment"),
            **({"curve_with_memory": score(run, args.distances, memory_window)}
               if condition == "in_segment" else {}),
        }
        for (scheme, condition, seed), run in runs.items()
    } | reused  # fmt: skip
    results = {
        "settings": sweep.settings(
            ["experiments.probes", *sys.argv[1:]], config=args.config, kind=kind, steps=args.steps,
            segment_len=cfg.data.segment_len, mem_len=cfg.model.mem_len, seeds=list(args.seeds),
            schemes=list(args.schemes), conditions=list(args.conditions), sets=list(args.set),
            trained=[shortest, longest], missing=missing,
        ),
        "chance": probes.CHANCE[kind],
        "runs": [measured[key] for key in every if key in measured],  # the sweep's order
    }  # fmt: skip
    sweep.write(out / f"{stem}.json", results)
    (out / f"{stem}.md").write_text(render(results))
    plot(results, out / f"{stem}.png")
    print(render(results))


if __name__ == "__main__":
    main()
