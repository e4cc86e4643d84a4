"""Memory probes: does memory let a model answer beyond its segment? Accuracy against distance.

    .venv/bin/python -m bench.probes [--config configs/probe_needle.py] [--steps N] [--distances ...]
    .venv/bin/python -m bench.probes --schemes txl,shaw,t5,deberta,alibi,rope   # every scheme

Trains the probe config twice with ``train.py`` (its memory, and ``mem_len`` 0; runs are reused when
finished), then scores both on fresh test documents at several distances with
``relpos_jax.analysis.probing.accuracy_by_distance`` (teacher-forced; segment and memory as in training).
Prints a markdown table; writes ``docs/results/<config>.png`` and ``<config>.json``. With
``--schemes``, each scheme is trained with the config's memory, beside the config's own scheme
without memory, into ``<config>_schemes.png`` and ``.json``.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

from bench import args as options
from bench.measure import ROOT
from relpos_jax.config import Config, load_config


def overrides(steps: int, mem_len: int, position: str, sets=()) -> list[str]:
    """The config overrides of one run, for ``train.py`` and for scoring alike."""
    return [
        f"train.steps={steps}", f"model.mem_len={mem_len}", f"model.position={position}", *sets
    ]  # fmt: skip


def train(config: str, workdir: pathlib.Path, steps: int, settings: list[str]) -> None:
    from relpos_jax.checkpoint import latest_step

    if latest_step(workdir / "checkpoints") == steps:
        return
    flags = [f"--config.{setting}" for setting in settings]
    command = [sys.executable, "train.py", "--config", config, "--workdir", str(workdir), *flags]
    subprocess.run(command, cwd=ROOT, check=True)


def score(config: str, workdir: pathlib.Path, settings: list[str], distances):
    from relpos_jax.analysis.probing import accuracy_by_distance
    from relpos_jax.data import probes
    from relpos_jax.evaluate import restore_model

    cfg = load_config(ROOT / config, settings)
    kind, *_ = probes.parse(cfg.data.name)
    model, c, _ = restore_model(cfg, workdir)
    return accuracy_by_distance(
        model, kind, distances, segment_len=c.data.segment_len, mem_len=c.model.mem_len,
        documents=256,
    )  # fmt: skip


def plot(curves: dict[str, list[dict]], path: pathlib.Path, segment_len: int, window: int) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(6, 3.6))
    ax = fig.add_subplot()
    for label, curve in curves.items():
        ax.plot(
            [c["distance"] for c in curve], [c["byte_accuracy"] for c in curve], "o-", label=label
        )
    first = next(iter(curves.values()))[0]
    ax.axhline(first["chance"], color="grey", ls=":", label="chance")
    ax.axvline(segment_len, color="k", lw=0.8, ls="--", label=f"segment ({segment_len})")
    ax.axvline(window, color="k", lw=0.8, ls="-.", label=f"segment + memory ({window})")
    ax.set(xlabel="distance to the key (bytes)", ylabel="answer-byte accuracy", ylim=(0, 1.02))
    ax.set_title(f"{first['kind']} probe")
    ax.legend(fontsize=7)
    fig.savefig(path, dpi=120, bbox_inches="tight")


def main() -> None:
    parser = options.parser(__doc__)
    parser.add_argument("--config", default="configs/probe_needle.py")
    parser.add_argument("--steps", type=int, default=None, help="default: the config's")
    parser.add_argument("--distances", type=options.ints, default="8,12,16,24,32,40,48,56,64,80,96")
    options.add_schemes(
        parser,
        None,
        help="train each of these schemes with the config's memory (and the config's own scheme "
        "without memory, as the reference); writes <config>_schemes.png and .json",
    )
    options.add_out(parser)
    options.add_runs(parser, "runs")
    options.add_overrides(parser, help="e.g. model.n_layers=1")
    args = parser.parse_args()

    cfg = Config.from_any(load_config(ROOT / args.config, args.set))
    steps = args.steps or cfg.train.steps
    distances = list(args.distances)
    stem = pathlib.Path(args.config).stem
    own, memory = cfg.model.position, cfg.model.mem_len
    runs = [(f"memory {memory}", own, memory), ("memory 0", own, 0)]
    if args.schemes:
        runs = [(f"{p}, memory {memory}", p, memory) for p in args.schemes]
        runs.append((f"{own}, memory 0", own, 0))
    curves = {}
    for label, position, mem_len in runs:
        scheme = "" if position == own else f"_{position}"  # the config's own runs keep their name
        workdir = pathlib.Path(args.runs) / f"{stem}{scheme}_mem{mem_len}"
        settings = overrides(steps, mem_len, position, args.set)
        train(args.config, workdir, steps, settings)
        curves[label] = score(args.config, workdir, settings, distances)
    out = pathlib.Path(args.out)
    stem = f"{stem}_schemes" if args.schemes else stem
    plot(
        curves, out / f"{stem}.png", cfg.data.segment_len, cfg.data.segment_len + cfg.model.mem_len
    )
    rows = [
        f"| {d} | "
        + " | ".join(
            f"{c[i]['byte_accuracy']:.3f} / {c[i]['document_accuracy']:.3f}"
            for c in curves.values()
        )
        + " |"
        for i, d in enumerate(distances)
    ]
    table = "\n".join(
        [f"| distance | {' | '.join(curves)} |", "|---:|" + "---:|" * len(curves), *rows]
    )
    print(table)
    (out / f"{stem}.json").write_text(json.dumps(curves, indent=1) + "\n")


if __name__ == "__main__":
    main()
