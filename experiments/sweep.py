"""What the training sweeps share: each run is one ``train.py`` and one ``eval.py`` command line
(``--dry-run`` lists those not finished, a run a line, so that a Slurm array or Ray can run a sweep
across machines), a finished run is reused (a killed sweep goes on where it stopped), and the
results go to a JSON (settings, commit, every seed's number) that the tables and plots are
rendered from.

How a table states its numbers and which differences it calls real (mean ± sd, twice the spread,
the paired bootstrap over test windows): ``experiments.compare``.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import pathlib
import shlex
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from typing import Any

import numpy as np

from bench import measure
from bench.measure import ROOT
from experiments.compare import WINDOWS

# pystdlib's Python where a result predates recording it: every one of them was measured on the
# project's CPU machine, whose Python is 3.11 (a GPU machine's 3.12 has another standard library)
PYTHON_BEFORE_RECORDED = "3.11"

# where a run was measured, as a sweep's settings keep it and a run reused from its JSON carries it
MEASURED_AT = ("commit", "machine", "date")


@dataclasses.dataclass(frozen=True)
class Run:
    """One training run of a sweep and its evaluation, ``eval.json`` in ``workdir`` when done."""

    name: str
    workdir: pathlib.Path
    config: str
    settings: tuple[str, ...]  # config overrides, section.field=value
    eval_flags: tuple[str, ...] = ("--splits", "test")

    @property
    def named_workdir(self) -> pathlib.Path:
        """``workdir`` as its command lines name it: relative to the repository root they run
        from, where it lies inside it."""
        inside = self.workdir.is_absolute() and self.workdir.is_relative_to(ROOT)
        return self.workdir.relative_to(ROOT) if inside else self.workdir

    def commands(self) -> list[list[str]]:
        flags = [
            "--config", self.config, "--workdir", str(self.named_workdir),
            *(f"--config.{s}" for s in self.settings),
        ]  # fmt: skip
        return [["python", "train.py", *flags], ["python", "eval.py", *flags, *self.eval_flags]]

    def result(self, steps: int) -> dict | None:
        """The run's ``eval.json`` if it finished ``steps`` steps on the corpus its settings name
        (for pystdlib, the same partition and Python), else None."""
        done = self.workdir / "eval.json"
        if done.exists():
            result = json.loads(done.read_text())
            if result.get("step") == steps and self._same_corpus(result):
                return result
        return None

    def _same_corpus(self, result: dict) -> bool:
        """Whether ``eval.json`` was measured on the pystdlib partition and Python this run asks
        for (``recorded_corpus``)."""
        from relpos_jax.config import load_config
        from relpos_jax.data import corpora

        data = load_config(ROOT / self.config, list(self.settings)).data
        asked = (data.partition, corpora.stdlib_python(data.name, data.python))
        return data.name != "pystdlib" or recorded_corpus(result.get("data", {})) == asked


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


def pending(runs: Iterable[Run], steps: int) -> list[Run]:
    """The runs that have not finished ``steps`` steps: what a dry run lists, so that a scheduler
    given a killed sweep's list trains and scores only what is left."""
    return [run for run in runs if run.result(steps) is None]


def list_pending(*groups: tuple[Iterable[Run], int]) -> None:
    """Print the command lines of each group's runs (``(runs, steps)``, in order) that are
    ``pending``; nothing at all, not an empty line for ``xargs``, when none is."""
    if listed := dry_run([run for runs, steps in groups for run in pending(runs, steps)]):
        print(listed)


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
    ``--dry-run`` the command lines of those not finished printed and None; else ``execute``d ->
    (the finished runs by key, their ``eval.json`` by name, the names of those left out)."""
    if args.dry_run:
        list_pending((runs.values(), args.steps))
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
    """The sweep's settings as the JSON keeps them: its command, commit, machine, date and the
    corpus partition its runs use."""
    return {
        "command": shlex.join(["python", "-m", *command]),
        "commit": measure.commit(),
        "machine": measure.machine(),
        "date": datetime.date.today().isoformat(),
        "partition": partition_of(command),
        "python": python_of(command),
        **more,
    }


def _overridden(command: Sequence[str], field: str) -> str | None:
    """The value the last ``--set <field>=…`` of a sweep's command line gives, or None."""
    given = [a.rsplit(f"{field}=", 1)[1] for a in command if f"{field}=" in a]
    return given[-1] if given else None


def partition_of(command: Sequence[str]) -> str:
    """The pystdlib partition (``data.partition``) a sweep's command line sets for its runs (``--set
    data.partition=…``), else configs/base.py's default."""
    from relpos_jax.config import defaults

    given = _overridden(command, "data.partition")
    return given if given is not None else defaults().data.partition


def python_of(command: Sequence[str]) -> str:
    """The Python whose standard library a sweep's runs read (``--set data.python=…``), else this
    one's."""
    from relpos_jax.data import corpora

    given = _overridden(command, "data.python")
    return given if given is not None else corpora.running_python()


def recorded_corpus(fields: dict) -> tuple[str, str]:
    """(partition, Python) of the pystdlib a result was measured on, as a sweep's settings or an
    ``eval.json``'s ``data`` record them; where they predate a field: "hash",
    ``PYTHON_BEFORE_RECORDED``."""
    return fields.get("partition", "hash"), fields.get("python", PYTHON_BEFORE_RECORDED)


def partition_text(settings: dict) -> str:
    """The corpus a sweep's results were measured on, for its table: pystdlib's Python and
    partition (``recorded_corpus``)."""
    partition, python = recorded_corpus(settings)
    return f"pystdlib of Python {python}, partition `{partition}`"


def load(path: pathlib.Path) -> dict | None:
    """A sweep's JSON at ``path``, or None where it is missing or older than the sweeps' settings
    (their command, commit and seeds)."""
    if not path.exists():
        return None
    results = read(path)
    settings = results.get("settings")
    return results if isinstance(settings, dict) and "command" in settings else None


def read(path: pathlib.Path) -> dict:
    """A sweep's JSON at ``path`` with its runs' windows read back from the file ``write`` put them
    in (a run whose file is missing keeps only their description: no windows)."""
    results = json.loads(pathlib.Path(path).read_text())
    files: dict[str, Any] = {}

    def arrays(name: str) -> dict:
        if name not in files:
            found = pathlib.Path(path).parent / name
            files[name] = dict(np.load(found)) if found.is_file() else {}
        return files[name]

    for run in results.get("runs") or []:
        for field, value in run.items():
            if field.endswith(WINDOWS):
                run[field] = _restored(value, arrays)
    return results


def _restored(value, arrays):
    """``value`` with each description ``write`` left (``{"file", "key", ...}``, at any depth of
    nested dicts) replaced by its windows where its file holds them."""
    if not isinstance(value, dict):
        return value
    if "key" in value and "file" in value:
        found = arrays(value["file"])
        if f"{value['key']}.bits" not in found:
            return value
        return {
            "bits": found[f"{value['key']}.bits"],
            "tokens": found[f"{value['key']}.tokens"],
            "layout": value["layout"],
        }
    return {k: _restored(v, arrays) for k, v in value.items()}


def recorded_runs(path: pathlib.Path, **same) -> list[dict]:
    """The runs an earlier write of a sweep's JSON at ``path`` holds, if its settings equal
    ``same`` (steps, overrides, ...; else none): a sweep whose run folders are gone (another
    machine, a cleaned disk) reuses them instead of training again. Each keeps the commit, machine
    and date it was measured at (``commit``, ``machine``, ``date``; a run reused before keeps its
    own)."""
    earlier = load(path)
    if earlier is None:
        return []
    settings = earlier["settings"]
    if any(settings.get(name) != value for name, value in same.items()):
        return []
    if recorded_corpus(settings) != (partition_of(sys.argv[1:]), python_of(sys.argv[1:])):
        return []  # another split of the corpus, or another Python's standard library
    return [with_measured_at(run, settings) for run in earlier["runs"]]


def with_measured_at(run: dict, settings: dict) -> dict:
    """``run``, a run of a sweep's JSON with these ``settings``, with where it was measured
    (``MEASURED_AT``): a run reused before carries its own (its commit at least), kept whole;
    else the JSON's."""
    here = {field: settings[field] for field in MEASURED_AT if field in settings}
    return run if "commit" in run else {**here, **run}


def recorded(path: pathlib.Path, key: Sequence[str], **same) -> dict[tuple, dict]:
    """``recorded_runs`` by the values of their ``key`` fields."""
    return {tuple(run[k] for k in key): run for run in recorded_runs(path, **same)}


def reusable(path: pathlib.Path, runs: dict, key: Sequence[str], steps: int, **same) -> dict:
    """The runs of ``runs`` (by key) that ``recorded`` finds at ``path`` and whose folder here has
    not finished ``steps`` (a finished run folder wins over the JSON)."""
    return {
        k: run
        for k, run in recorded(path, key, steps=steps, **same).items()
        if k in runs and runs[k].result(steps) is None
    }


def _reused(settings: dict, runs: Sequence[dict]) -> list[dict]:
    """The runs measured at another commit than the sweep's own (``recorded``: reused)."""
    return [run for run in runs if run.get("commit", settings["commit"]) != settings["commit"]]


def reused_commits(results: dict) -> list[str]:
    """The commits, other than the sweep's own, that runs of its JSON were reused from
    (``recorded``), in the order they first occur."""
    reused = _reused(results["settings"], results.get("runs") or [])
    return list(dict.fromkeys(run["commit"] for run in reused))


def commits_lines(settings: dict, runs: Sequence[dict], name, seed=None) -> list[str]:
    """The table's note on runs reused from an earlier commit (``recorded``), if any: by the
    commit, and the machine and date where the JSON kept them; each run called ``name(run)``, or,
    with ``seed``, the runs of one name listed once with their ``seed(run)``s (each once)."""
    older: dict[tuple, dict[str, dict]] = {}  # the seeds of a name as dict keys: each once
    for run in _reused(settings, runs):
        where = tuple(run.get(f) for f in MEASURED_AT)
        older.setdefault(where, {}).setdefault(name(run), {})[seed and seed(run)] = None
    lines = []
    for (commit, *where), named in older.items():
        at = ", ".join(filter(None, where))
        listed = (
            ", ".join(named) if seed is None else "; ".join(
                f"{n}: seed{'s' * (len(seeds) > 1)} {', '.join(map(str, seeds))}"
                for n, seeds in named.items()
            )
        )  # fmt: skip
        lines.append(
            f"Reused from the JSON of commit {commit}{f' ({at})' if at else ''}: {listed}."
        )
    return lines


def write(path: pathlib.Path, results: dict) -> None:
    """``results`` as JSON at ``path``; its runs' windows (fields ending in ``_windows``, as
    ``compare.windows_of`` gives them, or dicts of them nested at any depth) in
    ``<name>_windows.npz`` beside it, the JSON naming their file, key, count and layout (``read``
    puts them back)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    name, arrays, runs = f"{path.stem}{WINDOWS}.npz", {}, []
    for index, run in enumerate(results.get("runs") or []):
        run = dict(run)
        for field, value in run.items():
            if field.endswith(WINDOWS):
                run[field] = _stored(value, f"{index}.{field}", name, arrays)
        runs.append(run)
    if arrays:
        with (path.parent / name).open("wb") as f:
            np.savez_compressed(f, **arrays)
        results = {**results, "runs": runs}
    path.write_text(json.dumps(results, indent=1) + "\n")


def _stored(value, key: str, name: str, arrays: dict):
    """``value`` with each of its windows (at any depth of nested dicts, keyed ``key.<k>…``) put in
    ``arrays`` and replaced by its description."""
    if isinstance(value, dict) and "bits" in value:
        arrays[f"{key}.bits"] = np.asarray(value["bits"], np.float64)
        arrays[f"{key}.tokens"] = np.asarray(value["tokens"], np.int64)
        return {"file": name, "key": key, "count": len(value["bits"]), "layout": value["layout"]}
    if isinstance(value, dict):
        return {k: _stored(v, f"{key}.{k}", name, arrays) for k, v in value.items()}
    return value


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
