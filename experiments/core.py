"""The core comparison from one command: one set of models, trained to a plateau, feeding every
column of the leaderboard, then the claim-by-claim table against the papers.

    .venv/bin/python -m experiments.core [--steps 4000] [--seeds 0,1,2]
        [--probe-seeds 0,1,2,3,4,5,6,7] [--runs runs/core] [--out docs/results] [--dry-run]
        [--finished-only]

In order, each a sweep of its own that resumes where it stopped:

1. ``experiments.ablation``: every scheme with memory 64 and without (Transformer-XL's Table 6 at small
   scale: 4 layers, d_model 128, segment 64), and the sinusoid without memory on half loss (the
   paper's absolute encoding), ``--steps`` steps, ``--seeds``;
2. ``experiments.extrapolation --models ablation``: the runs without memory of step 1 at 1×–512× their
   length (64 to 32,768), non-overlapping and in sliding windows, and RoPE fine-tuned at 2×–8× by
   position interpolation, NTK-aware and YaRN (a tenth of ``--steps`` each);
3. ``experiments.recl --ablation``: RECL of Dai et al.'s group (TXL, Shaw, TXL without recurrence,
   vanilla) from the runs of step 1;
4. ``experiments.init_best``: Table 6's init and best evaluation context of every run of step 1;
5. ``experiments.probes``: the needle probe, models of its own (its own task), ``--probe-seeds``;
6. ``experiments.leaderboard`` and ``experiments.papers``: the tables, from the JSONs.

Everything goes to ``--out`` (``docs/results``): the home of this protocol's results; the earlier
sweeps' tables, which mixed models, steps and splits, are in ``docs/results/earlier``.

``--dry-run`` prints the unfinished training runs of steps 1, 2 and 5, each command line once
(step 2 reuses step 1's runs; its fine-tunes start from them, so a scheduler runs them after), for
a Slurm array or ``xargs -P``; then run this command again (or with ``--finished-only``) to score
and tabulate.
"""

from __future__ import annotations

import subprocess
import sys

from bench import args as options
from bench.measure import ROOT

SIZES = ("model.n_layers=4", "model.d_model=128", "model.d_ff=512", "data.segment_len=64")
MEMORY = 64
HALF_LOSS = "sinusoid"  # Table 6's absolute encoding, also trained on half loss
TRAINING = (
    "experiments.ablation",
    "experiments.extrapolation",
    "experiments.probes",
)  # the sweeps that train
FACTORS = "1,2,4,8,16,32,64,128,256,512"  # of segment 64: up to 32,768, both protocols
FINE_TUNED = ("linear", "ntk", "yarn")  # RoPE's extensions fine-tuned at 2×–8× (YaRN's Table 1)


def commands(args) -> list[list[str]]:
    """The sweeps' command lines, in order (``python -m experiments.<sweep> …``)."""
    seeds, sets = ",".join(map(str, args.seeds)), [f"--set={s}" for s in (*SIZES, *args.set)]
    runs, out = ["--runs", args.runs], ["--out", args.out]
    common = ["--steps", str(args.steps), "--seeds", seeds, *runs, *sets, *out]
    return [
        ["experiments.ablation", "--mem-len", str(MEMORY), "--half-loss", HALF_LOSS, *common],
        ["experiments.extrapolation", "--models", "ablation", "--factors", FACTORS,
         "--sliding-up-to", str(64 * 512), "--pi-steps", str(args.steps // 10),
         "--fine-tune", ",".join(FINE_TUNED), *common],
        ["experiments.recl", "--ablation", "--mem-len", str(MEMORY), "--seeds", seeds, *runs, *sets,
         *out],
        ["experiments.init_best", "--mem-len", str(MEMORY), "--half-loss", HALF_LOSS, *common],
        ["experiments.probes", "--steps", str(args.steps), "--seeds",
         ",".join(map(str, args.probe_seeds)), "--runs", f"{args.runs}/probes", *out],
        ["experiments.leaderboard", "--results", args.out, *out],
        ["experiments.papers", "--results", args.out, *out],
    ]  # fmt: skip


def _python(command: list[str], *extra: str, capture: bool = False):
    return subprocess.run(
        [sys.executable, "-m", *command, *extra], cwd=ROOT, check=True, text=True,
        capture_output=capture,
    )  # fmt: skip


def dry_run(args) -> str:
    """Every training run of the sweeps not yet finished, each command line once, in order."""
    lines: dict[str, None] = {}
    for command in commands(args):
        if command[0] in TRAINING:
            listed = _python(command, "--dry-run", capture=True).stdout.splitlines()
            lines.update(dict.fromkeys(line for line in listed if line.startswith("python ")))
    return "\n".join(lines)


def main() -> None:
    parser = options.parser(__doc__)
    parser.add_argument("--steps", type=int, default=4000, help="every model's training steps")
    parser.add_argument("--seeds", type=options.ints, default="0,1,2", help="train.seed values")
    parser.add_argument("--probe-seeds", type=options.ints, default="0,1,2,3,4,5,6,7")
    parser.add_argument("--dry-run", action="store_true", help="list the training runs only")
    parser.add_argument(
        "--finished-only", action="store_true", help="train nothing: tabulate what has finished"
    )
    options.add_runs(parser, "runs/core")
    options.add_overrides(parser, help="applied to every run of steps 1-3 (after the sizes)")
    parser.add_argument("--out", default=str(ROOT / "docs" / "results"))
    args = parser.parse_args()
    if args.dry_run:
        print(dry_run(args))
        return
    for command in commands(args):
        finished = ["--finished-only"] if args.finished_only and command[0] in TRAINING else []
        print(f"== python -m {' '.join(command)}", flush=True)
        _python(command, *finished)


if __name__ == "__main__":
    main()
