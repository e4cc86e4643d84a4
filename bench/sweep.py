"""What the training sweeps share: each run is one ``train.py`` and one ``eval.py`` command line
(``--dry-run`` lists them, a run a line, so that a Slurm array or Ray can run a sweep across
machines), a finished run is reused (a killed sweep goes on where it stopped), and the results go
to a JSON (settings, commit, every seed's number) that the tables and plots are rendered from.

Spreads are the sample standard deviation over seeds; ``apart`` says whether two means differ by
more than twice the larger spread, the bar for writing "better than" in a table.
"""

from __future__ import annotations

import dataclasses
import datetime
import itertools
import json
import pathlib
import shlex
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence

from bench import measure
from bench.measure import ROOT


@dataclasses.dataclass(frozen=True)
class Run:
    """One training run of a sweep and its evaluation, ``eval.json`` in ``workdir`` when done."""

    name: str
    workdir: pathlib.Path
    config: str
    settings: tuple[str, ...]  # config overrides, section.field=value
    eval_flags: tuple[str, ...] = ("--splits", "test")

    def commands(self) -> list[list[str]]:
        inside = self.workdir.is_absolute() and self.workdir.is_relative_to(ROOT)
        workdir = self.workdir.relative_to(ROOT) if inside else self.workdir  # run from ROOT
        flags = [
            "--config", self.config, "--workdir", str(workdir),
            *(f"--config.{s}" for s in self.settings),
        ]  # fmt: skip
        return [["python", "train.py", *flags], ["python", "eval.py", *flags, *self.eval_flags]]

    def result(self, steps: int) -> dict | None:
        """The run's ``eval.json`` if it finished ``steps`` steps, else None."""
        done = self.workdir / "eval.json"
        if done.exists():
            result = json.loads(done.read_text())
            if result.get("step") == steps:
                return result
        return None


def validation_curve(workdir: pathlib.Path) -> list[tuple[int, float]]:
    """``(step, valid bpc)`` of each validation during a run's training (its ``metrics.jsonl``)."""
    path = workdir / "metrics.jsonl"
    if not path.exists():
        return []
    records = (json.loads(line) for line in path.read_text().splitlines() if line.strip())
    by_step = {r["step"]: r["valid/bpc"] for r in records if "valid/bpc" in r}  # a rerun: the last
    return sorted(by_step.items())


def dry_run(runs: Sequence[Run]) -> str:
    """The sweep's runs, one shell line each (its commands joined by ``&&``), from the repository
    root: ``| xargs -P 2 -I{} sh -c {}`` or a Slurm array runs them side by side."""
    return "\n".join(" && ".join(shlex.join(c) for c in run.commands()) for run in runs)


def execute(runs: Sequence[Run], steps: int, finished_only: bool = False) -> dict[str, dict]:
    """Each run's ``eval.json`` by name: finished runs read back, the others run in turn here (with
    ``finished_only``, left out: the tables then name them as missing)."""
    results = {}
    for index, run in enumerate(runs, 1):
        result = run.result(steps)
        state = "done" if result is not None else "left out" if finished_only else "running"
        print(f"[{index}/{len(runs)}] {run.name}: {state}", file=sys.stderr, flush=True)
        if result is None and finished_only:
            continue
        if result is None:
            start = time.perf_counter()
            for command in run.commands():
                subprocess.run([sys.executable, *command[1:]], cwd=ROOT, check=True)
            result = run.result(steps)
            if result is None:
                raise RuntimeError(f"{run.name}: eval.json of step {steps} missing after the run")
            print(f"  {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)
        results[run.name] = result
    return results


def finish(runs: dict, args) -> tuple[dict, dict[str, dict], list[str]] | None:
    """A sweep's runs (a dict by key) as its options (``add_options``, ``args.steps``) say: with
    ``--dry-run`` their command lines printed and None; else ``execute``d -> (the finished runs by
    key, their ``eval.json`` by name, the names of those left out)."""
    if args.dry_run:
        print(dry_run(list(runs.values())))
        return None
    evaluated = execute(list(runs.values()), args.steps, args.finished_only)
    missing = [run.name for run in runs.values() if run.name not in evaluated]
    return {k: run for k, run in runs.items() if run.name in evaluated}, evaluated, missing


def add_options(parser) -> None:
    """``--dry-run`` and ``--finished-only``, which every sweep takes."""
    parser.add_argument("--dry-run", action="store_true", help="list the command lines only")
    parser.add_argument(
        "--finished-only", action="store_true",
        help="tabulate the runs that have finished, name the others as missing, run nothing",
    )  # fmt: skip


def missing_lines(settings: dict) -> list[str]:
    """The table's note on runs of the sweep that had not finished, if any."""
    missing = settings.get("missing") or []
    if not missing:
        return []
    return ["", f"Not finished when this was written, so left out: {', '.join(missing)}."]


def settings(command: Sequence[str], **more) -> dict:
    """The sweep's settings as the JSON keeps them: its command, commit, machine and date."""
    return {
        "command": shlex.join(["python", "-m", *command]),
        "commit": measure.commit(),
        "machine": measure.machine(),
        "date": datetime.date.today().isoformat(),
        **more,
    }


def mean_sd(values: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (0 for one value)."""
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return statistics.mean(values), spread


def mean_sd_text(values: Sequence[float], digits: int) -> str:
    """``mean ± sd`` of ``values`` with ``digits`` decimals, as the tables print it ("nan ± 0" for
    none)."""
    mean, sd = mean_sd(values) if values else (float("nan"), 0.0)
    return f"{mean:.{digits}f} ± {sd:.{digits}f}"


def apart(a: Sequence[float], b: Sequence[float]) -> bool:
    """Whether the means differ by more than twice the larger spread (never with one seed)."""
    (mean_a, sd_a), (mean_b, sd_b) = mean_sd(a), mean_sd(b)
    if min(len(a), len(b)) < 2:
        return False
    return abs(mean_a - mean_b) > 2 * max(sd_a, sd_b)


def apart_in_ranking(order: Sequence, values: dict) -> list[tuple]:
    """The neighbours ``(a, b)`` of ``order`` (keys of ``values``, lowest mean first) whose seeds
    are ``apart``: where a table may write "a lower than b, next in the ranking"."""
    return [(a, b) for a, b in itertools.pairwise(order) if apart(values[a], values[b])]


def load(path: pathlib.Path) -> dict | None:
    """A sweep's JSON at ``path``, or None where it is missing or older than the sweeps' settings
    (their command, commit and seeds)."""
    if not path.exists():
        return None
    results = json.loads(path.read_text())
    settings = results.get("settings")
    return results if isinstance(settings, dict) and "command" in settings else None


def recorded(path: pathlib.Path, key: Sequence[str], **same) -> dict[tuple, dict]:
    """The runs an earlier write of a sweep's JSON at ``path`` holds, by the values of their
    ``key`` fields, if its settings equal ``same`` (steps, overrides, ...; else none): a sweep
    whose run folders are gone (another machine, a cleaned disk) reuses them instead of training
    again. Each keeps the commit it was measured at (``commit``)."""
    earlier = load(path)
    if earlier is None:
        return {}
    settings = earlier["settings"]
    if any(settings.get(name) != value for name, value in same.items()):
        return {}
    return {
        tuple(run[k] for k in key): {"commit": settings["commit"], **run} for run in earlier["runs"]
    }


def reusable(path: pathlib.Path, runs: dict, key: Sequence[str], steps: int, **same) -> dict:
    """The runs of ``runs`` (by key) that ``recorded`` finds at ``path`` and whose folder here has
    not finished ``steps`` (a finished run folder wins over the JSON)."""
    return {
        k: run
        for k, run in recorded(path, key, steps=steps, **same).items()
        if k in runs and runs[k].result(steps) is None
    }


def commits_lines(settings: dict, runs: Sequence[dict], name) -> list[str]:
    """The table's note on runs reused from an earlier commit (``recorded``), if any, each called
    ``name(run)``."""
    older: dict[str, list[str]] = {}
    for run in runs:
        if run.get("commit", settings["commit"]) != settings["commit"]:
            older.setdefault(run["commit"], []).append(name(run))
    return [f"Reused from the JSON of commit {commit}: {', '.join(names)}."
            for commit, names in older.items()]  # fmt: skip


def write(path: pathlib.Path, results: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1) + "\n")


def publish(out, name: str, results: dict, render, plot=None, png: str | None = None) -> None:
    """``<name>.json`` in ``out``, its table ``<name>.md`` rendered from it and printed, and its plot
    (``png``, default ``<name>.png``) drawn by ``plot(results, path)``."""
    out = pathlib.Path(out)
    write(out / f"{name}.json", results)
    table = render(results)
    (out / f"{name}.md").write_text(table)
    if plot is not None:
        plot(results, out / (png or f"{name}.png"))
    print(table)
