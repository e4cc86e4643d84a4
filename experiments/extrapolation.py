"""Train short, test long (the ALiBi paper's Table 2, small scale), over seeds and without the
untrained-table confound: bpc against evaluation length.

    .venv/bin/python -m experiments.extrapolation [--schemes ...] [--seeds 0,1,2] [--train-len 128]
        [--steps 500] [--variants defaults,sized] [--factors 1,2,4,8,16,64,256] [--tokens 0]
        [--set model.n_layers=4 ...] [--dry-run]

Trains each scheme without memory at segment ``--train-len`` (``configs/<scheme>_small.py``, one
``experiments.sweep`` run per scheme, variant and seed: reused when finished, listed by ``--dry-run``) and
scores the test split (its first ``--tokens``; 0: all of it, at least 64 windows of 32,768 with the
default partition) at lengths L = train-len × factor, with no memory, two ways:

- non-overlapping: the tokens cut into segments of L, each scored from scratch;
- sliding window: windows of L moved by ``--stride`` (default L / 2), each scoring only its last
  stride tokens, so that every token sees at least L − stride tokens of context; only up to
  ``--sliding-up-to`` (it costs twice a non-overlapping pass).

Each length's bpc and evaluation windows are kept in the run's folder as soon as they are measured
(``experiments.extrapolation_scoring``): a stopped sweep goes on from there, a sweep run again with
more ``--factors`` scores only the new lengths (and lengths scored before windows were kept), and
``--scored-only`` tabulates what has been scored so far (the table marks the cells still missing).
A run whose folder is gone (another machine, a cleaned disk) is tabulated from the rows its
``extrapolation.json`` in ``--out`` holds, where they were scored with the same settings and
hold every cell (``reusable_rows``; else it is trained and scored again): the table names the
commit they were measured at.

Lengths from ``--tiled-from`` on run through the tiled attention path (memory linear in L).

With ``--models ablation`` the models are ``experiments.ablation``'s runs without memory (the same names,
settings and ``--runs`` folder, ``--steps``, ``--seeds`` and ``--set`` as that sweep; trained
there, or here if missing), so that the leaderboard's test bpc and its extrapolation columns come
from one set of models; the trained length is then their ``data.segment_len`` and there is no
sized variant.

Learned absolute positions have no row beyond their table (``model.learned.max_len``): name them with
``--schemes`` only for lengths within it. Variants: ``defaults`` keeps the config's position tables;
``sized`` (only for the schemes that have tables: shaw, t5, deberta) sizes them to the trained
distances, so that no row or bucket the evaluation reads was left at its initialisation: Shaw's
k = L_train − 1, T5's max distance L_train, DeBERTa's buckets exact to L_train / 4 and logarithmic
to L_train. Where sizing leaves a scheme's tables as they are (T5 at L_train = 128), there is no
sized run; the table says so. RoPE is also scored with its length extensions applied at
evaluation time without retraining (factor L / train-len): position interpolation (``linear``),
NTK-aware (``ntk``), dynamic NTK, YaRN and Llama 3, at the factors the papers use zero-shot (up to
``--extensions-up-to``, 8), with YaRN's β scaled to the trained length (``rope_stretch.yarn_betas``:
its defaults are rotation counts over L₀ = 4,096). Position interpolation is also fine-tuned, as its
paper does: ``--pi-steps`` steps (default 50: a tenth of the default 500-step pretraining, 1/80 of
the core comparison's 4,000 steps) of each seed's RoPE run at each of those factors with positions
scaled by 1 / factor (``configs/rope_pi.py``, ``train.init_from``), scored at that length (row
``rope+linear, fine-tuned``); ``--fine-tune linear,ntk,yarn`` fine-tunes those extensions the same
way (YaRN's Table 1 fine-tunes PI, NTK and YaRN alike), each scored at its length and at twice it
(YaRN's question: which degrades least past the window it was fine-tuned at). These runs start
from their RoPE run, so ``--dry-run`` lists them after it: a scheduler must run them once it has
finished.

Writes ``extrapolation.json`` (settings, every seed's bpc; its windows, in blocks, in
``extrapolation_windows.npz``) and renders ``extrapolation.md`` (the mean over seeds and its
bootstrap interval where every seed kept windows, else mean ± sd) and ``extrapolation.png`` from it
(``experiments.extrapolation_tables``).
"""

from __future__ import annotations

import argparse
import pathlib
import sys

from bench import args as options
from bench.measure import ROOT
from experiments import compare, sweep
from experiments.common import (
    EXTRAPOLATION_SCHEMES,
    config_file,
    config_for,
    extrapolation_run_name,
)
from experiments.extrapolation_scoring import ROPE_EXTENSIONS as ROPE_EXTENSIONS  # the rows it adds
from experiments.extrapolation_scoring import labels_of, protocols_at, score
from experiments.extrapolation_tables import plot, render
from relpos_jax.config import load_config
from relpos_jax.positions.rope_stretch import yarn_betas

WINDOWS_AT_MOST = 256  # blocks a cell's windows are summed into for the sweep's JSON
FINE_TUNABLE = ("linear", "ntk", "yarn", "llama3")  # dynamic NTK's factor follows the length


def fine_tuned_label(kind: str) -> str:
    return f"rope+{kind}, fine-tuned"


PI_LABEL = fine_tuned_label("linear")  # position interpolation with its short fine-tune
SIZED = ("shaw", "t5", "deberta")  # the schemes whose tables the "sized" variant changes


def variant_settings(variant: str, train_len: int) -> tuple[str, ...]:
    """The config overrides of a variant (``sized``: tables within the trained distances)."""
    if variant == "defaults":
        return ()
    return (
        f"model.shaw.max_distance={train_len - 1}", f"model.t5.max_distance={train_len}",
        f"model.t5.num_buckets={min(32, train_len)}",  # half of them exact, below the max
        f"model.deberta.bucket_size={max(2, train_len // 2)}",
        f"model.deberta.max_position={train_len}",
    )  # fmt: skip


def sized_as_defaults(scheme: str, train_len: int) -> bool:
    """Whether sizing ``scheme``'s tables to ``train_len`` leaves its config as it is (T5 at 128:
    max distance 128 and 32 buckets are its defaults), so the sized run would repeat the other."""
    overrides = variant_settings("sized", train_len)
    sized = load_config(ROOT / config_file(scheme), list(overrides))
    defaults = load_config(ROOT / config_file(scheme))
    fields = (o.split("=")[0].removeprefix("model.").split(".") for o in overrides)
    own = [f for s, f in fields if s == scheme]  # the scheme's own settings: model.<scheme>.<f>
    return all(sized.model[scheme][f] == defaults.model[scheme][f] for f in own)


def ablation_runs(args) -> dict[tuple[str, str, int], sweep.Run]:
    """``experiments.ablation``'s runs without memory (``--models ablation``), as its command line with
    these ``--runs``, ``--steps``, ``--seeds`` and ``--set`` makes them."""
    from experiments import ablation

    same = argparse.Namespace(
        schemes=args.schemes, mem_len=0, seeds=args.seeds, runs=args.runs, steps=args.steps,
        eval_every=0, set=args.set,
    )  # fmt: skip
    return {
        (scheme, "defaults", seed): run for (scheme, _, seed), run in ablation.runs_of(same).items()
    }


def runs_of(args) -> dict[tuple[str, str, int], sweep.Run]:
    if args.models == "ablation":
        return ablation_runs(args)
    runs = {}
    for scheme in args.schemes:
        for variant in args.variants:
            if variant != "defaults" and scheme not in SIZED:
                continue  # nothing to size: the defaults run is that scheme's only one
            if variant == "sized" and scheme in args.sized_as_defaults:
                continue  # the same config as the defaults run: render() says so
            for seed in args.seeds:
                name = extrapolation_run_name(scheme, variant, args.train_len, seed)
                settings = (
                    f"train.steps={args.steps}", f"train.seed={seed}", "train.eval_every=0",
                    "model.mem_len=0", f"data.segment_len={args.train_len}",
                    *variant_settings(variant, args.train_len), *args.set,
                )  # fmt: skip
                runs[scheme, variant, seed] = sweep.Run(
                    name, pathlib.Path(args.runs) / name, config_file(scheme), settings
                )
    return runs


def pi_factors(args) -> list[int]:
    """The factors RoPE is fine-tuned at: the swept ones from 2 up to ``--extensions-up-to`` (none
    without ``--pi-steps`` or RoPE's defaults run)."""
    if not args.pi_steps or "rope" not in args.schemes or "defaults" not in args.variants:
        return []
    return [f for f in args.factors if 2 <= f <= args.extensions_up_to]


def fine_tune_name(kind: str, factor: int, train_len: int, seed: int) -> str:
    """``rope_pi4_len64_seed0`` for position interpolation, ``rope_yarn4_len64_seed0`` for YaRN."""
    return f"rope_{'pi' if kind == 'linear' else kind}{factor}_len{train_len}_seed{seed}"


def fine_tune_runs_of(args, runs: dict) -> dict[tuple[str, int, int], sweep.Run]:
    """Each seed's fine-tune of its RoPE run (``runs``) by each ``--fine-tune`` extension at each
    ``pi_factors`` factor, by (extension, factor, seed): segments factor × longer with factor ×
    fewer rows (the same tokens a step), ``configs/rope_pi.py``'s gentle learning rate."""
    factors = pi_factors(args)
    if not factors:  # no RoPE run to start from, or --pi-steps 0
        return {}
    bases = {seed: runs["rope", "defaults", seed] for seed in args.seeds}
    batches = {  # each base run's rows, read once
        seed: load_config(ROOT / base.config, list(base.settings)).data.batch_size
        for seed, base in bases.items()
    }
    fine_tunes = {}
    for kind in args.fine_tune:
        for factor in factors:
            for seed, base in bases.items():
                batch = batches[seed]
                name = fine_tune_name(kind, factor, args.train_len, seed)
                settings = (
                    *args.set, f"train.steps={args.pi_steps}", f"train.seed={seed}",
                    "train.eval_every=0", "model.mem_len=0",
                    f"data.segment_len={args.train_len * factor}",
                    f"data.batch_size={max(1, batch // factor)}",
                    f"train.init_from={base.named_workdir}",
                )  # fmt: skip
                spec = f"{factor}" if kind == "linear" else f"{factor},{kind},{args.train_len}"
                fine_tunes[kind, factor, seed] = sweep.Run(
                    name, pathlib.Path(args.runs) / name, f"configs/rope_pi.py:{spec}", settings
                )
    return fine_tunes


def past_label(kind: str) -> str:
    return f"{fine_tuned_label(kind)}, at 2× its length"


def own_rows(scheme: str, args) -> list[tuple[str, list[int]]]:
    """(label, lengths) of each row a run of ``scheme`` gives: its own at every length, RoPE's
    extensions only up to ``--extensions-up-to``."""
    return [
        (label, [args.train_len * f for f in args.factors
                 if kind is None or f <= args.extensions_up_to])
        for label, kind in labels_of(scheme)
    ]  # fmt: skip


def fine_tuned_rows(kind: str, factor: int, args) -> list[tuple[str, list[int]]]:
    """(row, [L]) a fine-tune at ``factor`` is scored in: its length, and twice it where swept."""
    length = args.train_len * factor
    rows = [(fine_tuned_label(kind), [length])]
    return rows + ([(past_label(kind), [2 * length])] if 2 * factor in args.factors else [])


def _cells(row: dict) -> set[tuple[str, str]]:
    """(protocol, length) of every cell a row holds."""
    return {(protocol, n) for protocol, by_length in row["bpc"].items() for n in by_length}


def _every_cell(lengths: list[int], args) -> set[tuple[str, str]]:
    """(protocol, length) of every cell a row scored at ``lengths`` holds once it is complete."""
    return {(protocol, str(n)) for n in lengths for protocol in protocols_at(n, args)}


def reusable_rows(args, runs: dict, fine_tunes: dict, **same) -> tuple[dict, dict]:
    """The rows an earlier ``extrapolation.json`` in ``--out`` holds for the runs and fine-tunes
    (by key) whose folder here has not finished, where it was scored with the same settings
    (``same``; the fine-tunes' also with the same ``--pi-steps``, ``--fine-tune`` and factors): a
    sweep whose run folders are gone (another machine, a cleaned disk) tabulates them instead of
    training again. A run is reused only with every row it scores, a fine-tune only with the RoPE
    run it started from, and a row only with every cell (not one tabulated by ``--scored-only``
    before it was finished); each row keeps where it was measured (``sweep.recorded_runs``)."""
    path = pathlib.Path(args.out) / "extrapolation.json"

    def rows_of(earlier, scheme: str, variant: str, seed: int, wanted) -> list[dict] | None:
        rows = []
        for label, lengths in wanted:  # each row of the run, by label and the lengths it scores
            rows += [
                row for row in earlier
                if (row["scheme"], row["variant"], row["seed"], row["label"])
                == (scheme, variant, seed, label)
                and _cells(row) == _every_cell(lengths, args)
            ]  # fmt: skip
        return rows if len(rows) == len(wanted) else None

    earlier = sweep.recorded_runs(path, **same)
    base = {
        key: rows
        for key, run in runs.items()
        if run.result(args.steps) is None
        and (rows := rows_of(earlier, *key, own_rows(key[0], args)))
    }  # fmt: skip
    earlier = sweep.recorded_runs(
        path, **same, pi_steps=args.pi_steps, fine_tune=list(args.fine_tune),
        pi_factors=pi_factors(args),
    )  # fmt: skip
    tuned = {
        key: rows
        for key, run in fine_tunes.items()
        if run.result(args.pi_steps) is None and ("rope", "defaults", key[2]) in base
        and (rows := rows_of(earlier, "rope", "defaults", key[2], fine_tuned_rows(*key[:2], args)))
    }  # fmt: skip
    return base, tuned


def in_sweep_order(*groups: tuple[dict, dict, dict]) -> list[dict]:
    """The rows of each group (its runs by key as the sweep lists them, the rows reused and those
    scored here, each by key) in the order of its runs (``--schemes``, then seeds; the fine-tunes
    after): the table, its seeded intervals and its plot are the same whichever runs were reused."""
    return [
        row
        for every, *rows_by_key in groups
        for key in every
        for rows in rows_by_key
        for row in rows.get(key, [])
    ]


def _row(scheme: str, variant: str, seed: int, label: str, scored) -> dict:
    """A row of the sweep's JSON: one run's label, its bpc and its windows (in blocks), by protocol
    and length."""
    windows = {
        protocol: {
            n: compare.in_blocks(w, WINDOWS_AT_MOST, nested=True) for n, w in by_length.items()
        }
        for protocol, by_length in scored.windows.items()
    }
    return {"scheme": scheme, "variant": variant, "seed": seed, "label": label, "bpc": scored.bpc,
            "bpc_windows": windows}  # fmt: skip


def main() -> None:
    parser = options.parser(__doc__)
    options.add_schemes(parser, EXTRAPOLATION_SCHEMES)
    parser.add_argument("--seeds", type=options.ints, default="0,1,2", help="train.seed values")
    parser.add_argument("--train-len", type=int, default=128)
    parser.add_argument(
        "--steps", type=int, default=500, help="training steps (500: 1M tokens at batch 16 × 128)"
    )
    parser.add_argument(
        "--variants", type=options.listed(choices=("defaults", "sized")),
        default="defaults,sized", help="position tables as configured, and sized to train-len",
    )  # fmt: skip
    parser.add_argument("--factors", type=options.ints, default="1,2,4,8,16,64,256")
    parser.add_argument(
        "--extensions-up-to", type=int, default=8,
        help="score RoPE's extensions only up to this factor (the papers' zero-shot range)",
    )  # fmt: skip
    parser.add_argument(
        "--pi-steps", type=int, default=50,
        help="position interpolation's fine-tune of each RoPE run at 2× … (0: none)",
    )  # fmt: skip
    parser.add_argument(
        "--fine-tune", type=options.listed(choices=FINE_TUNABLE), default="linear",
        help="the RoPE extensions fine-tuned at 2× … (linear: position interpolation)",
    )  # fmt: skip
    parser.add_argument("--tokens", type=int, default=0, help="test tokens scored (0: all)")
    parser.add_argument("--stride", type=int, default=None, help="sliding; default: L / 2")
    parser.add_argument("--batch-tokens", type=int, default=32768)
    parser.add_argument(
        "--sliding-up-to", type=int, default=2048,
        help="score sliding windows only up to this L (each costs twice a non-overlapping pass)",
    )  # fmt: skip
    parser.add_argument(
        "--scored-only", action="store_true",
        help="tabulate the lengths already scored (kept in each run's folder), score nothing",
    )  # fmt: skip
    parser.add_argument("--tiled-from", type=int, default=2048, help="tiled attention from L")
    parser.add_argument(
        "--models", choices=("own", "ablation"), default="own",
        help="own: trained here at --train-len; ablation: experiments.ablation's runs without memory",
    )  # fmt: skip
    sweep.add_options(parser)
    options.add_runs(parser, "runs/extrapolation")
    options.add_overrides(parser, help="applied to every run")
    options.add_out(parser, "docs/results")
    args = parser.parse_args()
    if args.models == "ablation":  # their trained length, and no sized variant
        args.train_len = config_for(args.schemes[0], 0, args.seeds[0], args.set).data.segment_len
        args.variants = ["defaults"]
    args.lengths = [args.train_len * f for f in args.factors]
    sizing = [s for s in args.schemes if s in SIZED and "sized" in args.variants]
    args.sized_as_defaults = [s for s in sizing if sized_as_defaults(s, args.train_len)]
    scoring = {  # what a run's rows depend on: rows scored with the same are reused
        "train_len": args.train_len, "steps": args.steps, "lengths": args.lengths,
        "tokens": args.tokens, "stride": args.stride, "extensions_up_to": args.extensions_up_to,
        "yarn": yarn_betas(args.train_len), "sliding_up_to": args.sliding_up_to,
        "models": args.models, "sets": list(args.set),
    }  # fmt: skip
    every_run = runs_of(args)
    every_tune = fine_tune_runs_of(args, every_run)
    reused, reused_tunes = reusable_rows(args, every_run, every_tune, **scoring)
    runs = {k: run for k, run in every_run.items() if k not in reused}
    fine_tunes = {k: run for k, run in every_tune.items() if k not in reused_tunes}
    if args.dry_run:  # the fine-tunes after the runs they start from
        sweep.list_pending((runs.values(), args.steps), (fine_tunes.values(), args.pi_steps))
        return
    runs, _, missing = sweep.finish(runs, args)
    fine_tune_args = argparse.Namespace(**{**vars(args), "steps": args.pi_steps})
    fine_tunes, _, fine_tunes_missing = sweep.finish(fine_tunes, fine_tune_args)
    scored_runs = {
        key: [
            _row(*key, label, scored)
            for label, scored in score(run, labels_of(key[0]), args.lengths, args).items()
        ]
        for key, run in runs.items()
    }
    scored_tunes = {
        (kind, factor, seed): [
            _row("rope", "defaults", seed, label, scored)
            for label, lengths in fine_tuned_rows(kind, factor, args)
            for label, scored in score(run, ((label, None),), lengths, args).items()
        ]
        for (kind, factor, seed), run in fine_tunes.items()
    }
    results = {
        "settings": sweep.settings(
            ["experiments.extrapolation", *sys.argv[1:]], **scoring, seeds=list(args.seeds),
            scored_only=args.scored_only, sized_as_defaults=args.sized_as_defaults,
            pi_steps=args.pi_steps, pi_factors=pi_factors(args), fine_tune=list(args.fine_tune),
            missing=missing + fine_tunes_missing,
        ),
        "runs": in_sweep_order(
            (every_run, reused, scored_runs), (every_tune, reused_tunes, scored_tunes)
        ),
    }  # fmt: skip
    sweep.publish(args.out, "extrapolation", results, render, plot)


if __name__ == "__main__":
    main()
