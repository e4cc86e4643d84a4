"""One table of every position scheme with memory and without, gathered from the sweeps' JSONs.

    .venv/bin/python -m experiments.leaderboard [--results docs/results] [--out docs/results]

Reads what the sweeps wrote in ``--results`` and renders ``README.md`` in ``--out``, a row for each
scheme the JSONs measured × memory (a scheme no sweep has run yet, such as one just added, has no
row: adding a scheme changes no table) and a column for each measure, mean ± sd over seeds (n, the
number of seeds), or mean [95 % bootstrap interval] where every run of the column kept its
evaluation windows (test bpc, from ``ablation_windows.npz``; bpc at 1×, 4×, 16×, from
``extrapolation_windows.npz``; ``compare.Compare``); the context columns each seed's context where
they differ (``compare.contexts_text``):

- test bpc: ``experiments.ablation`` (``ablation.json``), memory as trained;
- bpc at 1×, 4× and 16× the training length: ``experiments.extrapolation`` (``extrapolation.json``),
  models trained without memory, so on the rows without memory, scored on the sweep's tokens (1×
  beside the longer lengths: the same tokens, where the test bpc column reads the whole split); the
  ``sized`` variant where the sweep has it (tables within the trained distances), the defaults
  otherwise; non-overlapping segments;
- RECL (r = 0.1): ``experiments.recl --ablation`` (``recl.json``), within the group that sweep measured
  (Dai et al.'s four by default; every scheme's runs in a JSON of the earlier protocol), "≥" where
  a seed still gained at the longest context measured (a lower bound);
- best context: ``experiments.init_best`` (``init_best.json``), the evaluation context c (memory, or
  window before the segment) of each run's lowest bpc: Table 6's "best" (its "init" is the trained
  memory, 64 or 0);
- needle solved: ``experiments.probes`` (``probe_needle.json``), the seeds whose accuracy averaged
  over the distances the probe trains on (every distance scored, for a JSON that predates that
  record) reaches ``probe_solved.SOLVED``, of the seeds run, with the share's exact 95 % interval:
  the lookup is learnt or not, so a mean over seeds would mix the two; the rows with memory from
  its ``memory`` condition, those without from ``in_segment``.

A cell the JSONs do not hold, or a JSON written before the sweeps kept their settings and seeds,
reads "not measured"; learned absolute positions read "n/a" there (the extrapolation sweep
leaves them out: past its ``max_len`` rows the table is clamped, not extended). Nothing is typed by
hand. Each column's command, commit and date follow the table.
"""

from __future__ import annotations

import pathlib

from bench import args as options
from experiments import probe_solved, sweep
from experiments.common import label_order, scheme_of
from experiments.compare import Compare, contexts_text, mean_sd_text, share_text
from relpos_jax.config import POSITIONS

NOT_MEASURED = "not measured"
NOT_APPLICABLE = "n/a"
NO_EXTRAPOLATION = ("learned",)  # a table of max_len rows: no position past it was ever trained
FACTORS = (1, 4, 16)  # the extrapolation columns: bpc at these multiples of the trained length
NEEDLE = "needle solved"  # seeds that solve the needle probe, of those run
DIGITS = 4  # of a bpc cell
CONTEXTS = {"RECL (r = 0.1)": "recl.json", "best context": "init_best.json"}  # grid columns: source
COLUMNS = (
    "test bpc", *(f"bpc at {f}×" for f in FACTORS), "RECL (r = 0.1)", "best context",
    NEEDLE,
)  # fmt: skip


def _ablation(results: dict, cells: dict) -> None:
    for run in results["runs"]:
        cells.setdefault((run["scheme"], run["memory"] > 0, "test bpc"), []).append(run["test_bpc"])


def _ablation_windows(results: dict, windows: dict) -> None:
    """Each run's test windows (None where it kept none), in the order of ``_ablation``'s bpc."""
    for run in results["runs"]:
        key = (run["scheme"], run["memory"] > 0, "test bpc")
        windows.setdefault(key, []).append(run.get("test_windows"))


def _extrapolated(results: dict, field: str):
    """(leaderboard key, each seed's non-overlapping ``field`` at 1×, 4×, 16×): ``bpc``, or
    ``bpc_windows`` (None where a run kept none)."""
    train_len = results["settings"]["train_len"]
    sized = {run["scheme"] for run in results["runs"] if run["variant"] == "sized"}
    for run in results["runs"]:
        wanted = "sized" if run["scheme"] in sized else "defaults"
        if run["variant"] != wanted or run["label"] != run["scheme"]:
            continue  # the other variant, or one of RoPE's extensions
        for factor in FACTORS:
            length = str(train_len * factor)
            if length in run["bpc"]["non-overlapping"]:
                value = (run.get(field) or {}).get("non-overlapping", {}).get(length)
                yield (run["scheme"], False, f"bpc at {factor}×"), value


def _extrapolation(results: dict, cells: dict) -> None:
    for key, bpc in _extrapolated(results, "bpc"):
        cells.setdefault(key, []).append(bpc)


def _extrapolation_windows(results: dict, windows: dict) -> None:
    """Each run's windows at 1×, 4×, 16× (None where it kept none), in ``_extrapolation``'s order."""
    for key, kept in _extrapolated(results, "bpc_windows"):
        windows.setdefault(key, []).append(kept)


def _recl(results: dict, cells: dict) -> None:
    for run in results["runs"]:
        if run.get("scheme") is None:
            continue  # a --run group, not the ablation's
        memory = run["mem_len"] > 0
        cells.setdefault((run["scheme"], memory, "RECL (r = 0.1)"), []).append(run["recl"]["0.1"])


def _init_best(results: dict, cells: dict) -> None:
    for run in results["runs"]:
        cells.setdefault((run["scheme"], run["memory"] > 0, "best context"), []).append(run["best"])


def _needle(results: dict, cells: dict) -> None:
    rows = {"memory": True, "in_segment": False}
    for run in results["runs"]:
        trained = probe_solved.trained_accuracy(results["settings"], run.get("curve", ()))
        if run["condition"] in rows and trained:
            solved = float(probe_solved.solves(trained))
            cells.setdefault((run["scheme"], rows[run["condition"]], NEEDLE), []).append(solved)


SOURCES = {  # file: (what it fills, the column it feeds)
    "ablation.json": (_ablation, "test bpc"),
    "extrapolation.json": (_extrapolation, "bpc at 1×, 4×, 16×"),
    "recl.json": (_recl, "RECL"),
    "init_best.json": (_init_best, "best context"),
    "probe_needle.json": (_needle, NEEDLE),
}
WINDOWS_SOURCES = {  # the columns whose runs keep windows
    "ablation.json": _ablation_windows,
    "extrapolation.json": _extrapolation_windows,
}


def gather(results_dir: pathlib.Path) -> tuple[dict, dict[str, dict], dict]:
    """({(scheme, memory?, column): [value of each seed]}, {file: its settings}, the same keys ->
    [each seed's evaluation windows or None], where a sweep keeps them)."""
    cells: dict[tuple[str, bool, str], list[float]] = {}
    windows: dict[tuple[str, bool, str], list] = {}
    sources = {}
    for name, (fill, _) in SOURCES.items():
        results = sweep.load(results_dir / name)
        if results is not None:
            fill(results, cells)
            if name in WINDOWS_SOURCES:
                WINDOWS_SOURCES[name](results, windows)
            sources[name] = {
                **results["settings"],
                "contexts": results.get("contexts") or results["settings"].get("contexts"),
                "reused": sweep.reused_commits(results),
            }
    return cells, sources, windows


def _cell(
    values: list[float] | None,
    longest: float | None = None,
    compare: Compare | None = None,
    key=None,
) -> str:
    """Mean ± sd (seeds), or mean [interval] by ``compare``'s rule; in the context columns
    (``CONTEXTS``) each seed's context where they differ, "≥" at ``longest`` (the longest context
    RECL or init/best measured: a lower bound)."""
    if not values:
        return NOT_MEASURED
    if key is not None and key[2] == NEEDLE:  # seeds that solve it: 1 each, else 0
        return share_text(int(sum(values)), len(values))
    if key is not None and key[2] in CONTEXTS:
        return f"{contexts_text([int(v) for v in values], longest)} ({len(values)})"
    text = compare.cell(key, DIGITS) if compare else mean_sd_text(values, DIGITS)
    return f"{text} ({len(values)})"


def _comparisons(cells: dict, windows: dict) -> dict[str, Compare]:
    """Each column's ``compare.Compare`` over its cells: the bootstrap rule where all of them have
    windows."""
    return {
        column: Compare({k: v for k, v in cells.items() if k[2] == column and v}, windows)
        for column in COLUMNS
    }


def render(cells: dict, sources: dict[str, dict], windows: dict | None = None) -> str:
    longest = {  # the longest context measured: a value there is a lower bound
        column: contexts[-1]
        for column, name in CONTEXTS.items()
        if (contexts := (sources.get(name) or {}).get("contexts"))
    }
    compare = {c: k for c, k in _comparisons(cells, windows or {}).items() if k.bootstrap}
    intervals = "".join(
        f" The {column} column reads {k.summary_rule}." for column, k in compare.items()
    )
    lines = [
        "# Leaderboard: every position scheme, with memory and without",
        "",
        "Gathered by `python -m experiments.leaderboard` from the sweeps' JSONs in this folder; mean ± "
        "sample sd over seeds, the number of seeds in brackets; RECL and best context: each "
        "seed's context where they differ (≥: at the longest measured, a lower bound); lower bpc "
        "is better, higher RECL too; needle solved: the seeds that solve the needle probe, of "
        "those run, with the share's exact 95% interval (its own models; without memory, the key "
        "inside the segment). Bpc at "
        "1×, 4× and 16× the training length is measured on models trained without memory, on the "
        "extrapolation sweep's tokens (the test bpc column reads the whole split). Best context: "
        "the evaluation context c (memory, or window before the segment) where a run scores best, "
        "the trained one being its memory. The settings of each measure (sizes, steps, memory, "
        "tokens) are in its table."
        f"{intervals} Claim by claim against the papers: [papers.md](papers.md).",
        "",
        "| scheme | memory | " + " | ".join(COLUMNS) + " |",
        "|---|---|" + "---:|" * len(COLUMNS),
    ]
    measured = {scheme for scheme, _, _ in cells}  # schemes, and variants such as "sinusoid+half"
    for scheme in sorted(measured, key=label_order):
        for memory in (True, False):
            if scheme not in POSITIONS and not any(k[:2] == (scheme, memory) for k in cells):
                continue  # a variant's row only where it was measured
            row = []
            for column in COLUMNS:
                if memory and column.startswith("bpc at"):
                    row.append("—")
                    continue
                if scheme_of(scheme) in NO_EXTRAPOLATION and column.startswith("bpc at"):
                    row.append(NOT_APPLICABLE)
                    continue
                values = cells.get((scheme, memory, column))
                row.append(_cell(values, longest.get(column), compare.get(column),
                                 (scheme, memory, column)))  # fmt: skip
            lines.append(f"| {scheme} | {'yes' if memory else 'no'} | " + " | ".join(row) + " |")
    lines += [
        "",
        f"{NOT_APPLICABLE}: {', '.join(NO_EXTRAPOLATION)} positions are a table of `max_len` rows, "
        "trained only up to the training length and clamped past it, so the extrapolation sweep "
        "leaves them out.",
        "",
        "Where each column comes from:",
        "",
    ]
    for name, (_, column) in SOURCES.items():
        s = sources.get(name)
        if s is None:
            lines.append(f"- {column}: {NOT_MEASURED} (no `{name}` with its settings yet)")
        else:
            corpus = "" if name.startswith("probe") else f", {sweep.partition_text(s)}"
            reused = f"; runs reused from commit {', '.join(s['reused'])}" if s["reused"] else ""
            lines.append(
                f"- {column}: `{s['command']}` (commit {s['commit']}, {s['date']}{corpus}{reused})"
            )
    return "\n".join([*lines, "", _one_set(sources), ""])


def _one_set(sources: dict[str, dict]) -> str:
    """Whether the model columns come from one set of models: the ablation's runs, scored for
    extrapolation (``experiments.extrapolation --models ablation``), RECL (``experiments.recl --ablation``)
    and init/best (``experiments.init_best``) with its steps and overrides."""
    ablation = sources.get("ablation.json")
    if ablation is None:
        return "The columns come from different runs (no ablation to share)."
    same = ("steps", "sets")
    apart = []
    extrapolation = sources.get("extrapolation.json")
    if extrapolation is not None and (
        extrapolation.get("models") != "ablation"
        or any(extrapolation.get(k) != ablation.get(k) for k in same)
    ):
        apart.append("bpc at 1×, 4× and 16× (models of its own)")
    recl = sources.get("recl.json")
    if recl is not None and (
        "--ablation" not in recl["command"]
        or recl.get("steps", ablation["steps"]) != ablation["steps"]
    ):
        apart.append("RECL")
    init_best = sources.get("init_best.json")
    if init_best is not None and any(init_best.get(k) != ablation.get(k) for k in same):
        apart.append("best context")
    if not apart:
        named = {"extrapolation.json": "extrapolation", "recl.json": "RECL",
                 "init_best.json": "best context"}  # fmt: skip
        columns = ["Test bpc", *(name for file, name in named.items() if file in sources)]
        listed = f"{', '.join(columns[:-1])} and {columns[-1]}" if len(columns) > 1 else columns[0]
        return f"{listed} come from one set of models: the ablation's runs."
    return (
        f"Not one set of models: {', '.join(apart)} come from runs other than the test bpc's "
        "(the needle probe trains models of its own, on its own task)."
    )


def main() -> None:
    parser = options.parser(__doc__)
    parser.add_argument("--results", default=str(pathlib.Path(options.ROOT) / "docs" / "results"),
                        help="where the sweeps' JSONs are")  # fmt: skip
    options.add_out(parser, "docs/results")
    args = parser.parse_args()
    text = render(*gather(pathlib.Path(args.results)))
    (pathlib.Path(args.out) / "README.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
