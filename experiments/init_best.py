"""Transformer-XL's Table 6 "PPL init" and "PPL best" for the runs of experiments.ablation: each model
at the evaluation context it was trained with and at the one that scores best.

    .venv/bin/python -m experiments.init_best --schemes txl,shaw --half-loss sinusoid --mem-len 64 \\
        --steps 4000 --seeds 0,1,2 --runs runs/core --set model.n_layers=4 ...  # the ablation's flags
        [--contexts 0,64,128,256,512] [--tokens 32768] [--dry-run]

Dai et al. score each model at the attention length it trained with (PPL init) and at the one that
scores best (PPL best; Attn Len, the shortest such length): only their relative encoding gained
from attending further than it trained. Here every run of the ablation (``{scheme}_mem{M|0}_seed{s}``,
``<scheme>+half`` for ``--half-loss``) is scored as it was trained, as ``experiments.recl`` scores it
(``relpos_jax.analysis.context_losses``): with a memory of c if it trained with one, else in fresh
windows of c + s tokens (absolute positions at most their trained window); the same ``--tokens`` test
tokens at every c, in segments of s = ``--segment``. init: c = its trained memory (0 without one,
always scored); best: the lowest bpc over ``--contexts`` (``relpos_jax.analysis.init_best``), with
the 95 % interval of best − init over blocks of s tokens.

Trains nothing: runs without a checkpoint are named as missing (``--dry-run`` lists every run, how it
is scored, and the ablation command that trains what is missing). Writes ``init_best.json`` after
each run and renders ``init_best.md``; a run the JSON holds, measured with the same settings and
with its ``eval.json`` unchanged (or its folder gone), is not measured again.
"""

from __future__ import annotations

import pathlib
import shlex
import statistics
import sys
from operator import itemgetter

from bench import args as options
from bench.measure import ROOT
from experiments import ablation, compare, sweep
from experiments.recl import BATCH_ROWS, trained
from relpos_jax.analysis.context_losses import MEMORY, scoring_for, trained_window
from relpos_jax.config import load_config

PAPER = {  # Table 6's PPL init / best / Attn Len beside each row
    key: f"{init} / {best} / {length}" + (f" ({model})" if model else "")
    for key, (init, best, length, model) in ablation.TABLE6.items()
}
KEEP = (
    "contexts",
    "tokens",
    "segment",
    "replicates",
)  # what a kept row must have been measured with


def measure(run: sweep.Run, label: str, mem_len: int, seed: int, args) -> dict:
    """One run's bpc at each context, its init and best, and the gain's interval."""
    from relpos_jax import data
    from relpos_jax.analysis.context_losses import scoring_losses
    from relpos_jax.analysis.init_best import init_and_best
    from relpos_jax.evaluate import restore_model

    model, cfg, step = restore_model(
        load_config(ROOT / run.config, list(run.settings)), run.workdir
    )
    scoring, longest = scoring_for(mem_len), trained_window(cfg)
    losses = scoring_losses(
        model, data.open_data(cfg.data, "test"), args.contexts,
        scoring=scoring, segment_len=args.segment, n_tokens=args.tokens, batch_size=BATCH_ROWS,
        longest_window=longest,
    )  # fmt: skip
    row = init_and_best(losses, mem_len, block=args.segment, replicates=args.replicates)
    print(f"{run.name} (step {step}, {scoring}): init {row['init']} {row['bpc'][str(mem_len)]:.4f}, "
          f"best {row['best']} {row['bpc'][str(row['best'])]:.4f}", flush=True)  # fmt: skip
    return {"run": run.name, "scheme": label, "memory": mem_len, "seed": seed, "scoring": scoring,
            "longest_window": longest, "trained": trained(run.workdir), **row}  # fmt: skip


def kept(earlier: dict | None, settings: dict, run: sweep.Run) -> dict | None:
    """The row ``earlier`` (an ``init_best.json``) holds for ``run``, if measured with the same
    settings and the run is unchanged since (or its folder gone), with where it was measured
    (``sweep.with_measured_at``)."""
    if earlier is None or any(earlier["settings"].get(k) != settings[k] for k in KEEP):
        return None
    if sweep.recorded_corpus(earlier["settings"]) != sweep.recorded_corpus(settings):
        return None  # another split of the corpus, or another Python's standard library
    row = next((r for r in earlier["runs"] if r["run"] == run.name), None)
    now = trained(run.workdir)
    if row is None or (now is not None and row["trained"] != now):
        return None
    return sweep.with_measured_at(row, earlier["settings"])


def _model(row: dict) -> str:
    return f"{row['scheme']}, memory {row['memory']}"


def render(results: dict) -> str:
    s = results["settings"]
    groups: dict[tuple[str, int], list[dict]] = {}
    for row in results["runs"]:
        groups.setdefault((row["scheme"], row["memory"]), []).append(row)
    lines = [
        "# Evaluation context: init and best (the Transformer-XL paper's Table 6, small scale)",
        "",
        f"Command: `{s['command']}`  ",
        f"Commit {s['commit']}, {s['machine']}, {s['date']}; {sweep.partition_text(s)}.",
        "",
        f"Each run of the ablation scored as it was trained on the same {s['tokens']:,} test tokens "
        f"in segments of s = {s['segment']}: with a memory of c positions if it trained with memory, "
        f"else in fresh windows of c + {s['segment']} tokens (absolute positions at most their "
        f"trained window), at c = {', '.join(map(str, s['contexts']))}. A token at offset j of its "
        "segment attends to c + j earlier tokens. **init**: c = the memory it trained with (0 "
        "without); **best**: the c of its lowest bpc, the shortest on a tie (each seed's, listed "
        "when they differ; ≥ at the longest c, a lower bound). Test bpc: the mean over seeds. "
        "**best − init**: the mean over seeds; beyond chance: the seeds whose 95% interval "
        "(percentile bootstrap over blocks of "
        f"{s['segment']} tokens, {s['replicates']:,} replicates, paired) lies below zero (best is "
        "chosen on the tokens it is scored on: the interval says that the longer context helps, "
        "its size is a little optimistic). "
        "The paper: WikiText-103 perplexity at init / at best / the shortest attention length that "
        "reaches best, trained at length 128.",
        "",
        "| scheme | memory | seeds | init bpc (c = memory) | best: c | bpc | best − init "
        "| beyond chance | paper, Table 6 (init / best / attn len) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    order = sorted(
        groups, key=lambda k: statistics.mean(r["bpc"][str(r["best"])] for r in groups[k])
    )
    for scheme, memory in order:
        rows = groups[scheme, memory]
        init = statistics.mean(r["bpc"][str(r["init"])] for r in rows)
        best = statistics.mean(r["bpc"][str(r["best"])] for r in rows)
        gain = statistics.mean(r["gain"][0] for r in rows)
        beyond = sum(r["gain"][2] < 0 for r in rows)
        contexts = compare.contexts_text([r["best"] for r in rows], s["contexts"][-1])
        lines.append(
            f"| {scheme} | {memory} | {len(rows)} | {init:.4f} | {contexts} | {best:.4f} | "
            f"{gain:+.4f} | {beyond} of {len(rows)} | {PAPER.get((scheme, memory > 0), '')} |"
        )
    if s.get("missing"):
        lines += ["", "Not measured, so left out (no finished run of these steps in the runs folder: "
                  f"not trained yet, or its folder is gone): {', '.join(s['missing'])}."]  # fmt: skip
    reused = sweep.commits_lines(s, results["runs"], _model, seed=itemgetter("seed"))
    return "\n".join([*lines, *(["", *reused] if reused else []), ""])


def dry_run(runs: dict, results: dict, earlier: dict | None, args) -> str:
    lines = [f"contexts {args.contexts}, {args.tokens:,} tokens, segments of {args.segment}"]
    untrained = []
    for (label, mem_len, _), run in runs.items():
        done = kept(earlier, results["settings"], run) is not None
        how = "with memory c" if scoring_for(mem_len) == MEMORY else "in windows"
        ready = (run.workdir / "checkpoints").exists()
        lines.append(f"  {run.name} ({label}, {how}): "
                     + ("in init_best.json already" if done else "to measure" if ready else "not trained"))  # fmt: skip
        if not (done or ready):
            untrained.append(label.removesuffix(ablation.HALF))
    if untrained:
        command = ["python", "-m", "experiments.ablation", "--schemes", ",".join(dict.fromkeys(untrained)),
                   "--mem-len", str(args.mem_len), "--steps", str(args.steps), "--seeds",
                   ",".join(map(str, args.seeds)), "--runs", str(args.runs), *(f"--set={s}" for s in args.set)]  # fmt: skip
        if args.half_loss:
            command[5:5] = ["--half-loss", ",".join(args.half_loss)]
        lines.append(f"train the missing runs first: {shlex.join(command)}")
    return "\n".join(lines)


def parse(argv: list[str] | None = None):
    parser = options.parser(__doc__)
    ablation.add_run_options(parser)  # the ablation's runs, named as it names them
    parser.add_argument("--contexts", type=options.ints, default="0,64,128,256,512",
                        help="evaluation contexts c (0 and --mem-len are added)")  # fmt: skip
    parser.add_argument("--tokens", type=int, default=32768, help="test tokens scored")
    parser.add_argument("--segment", type=int, default=64, help="s: tokens scored per segment")
    parser.add_argument("--replicates", type=int, default=2000, help="bootstrap replicates")
    parser.add_argument("--dry-run", action="store_true", help="list the runs, measure nothing")
    options.add_runs(parser, "runs/ablation")
    options.add_out(parser, "docs/results")
    options.add_overrides(parser, help="as the ablation's runs had")
    args = parser.parse_args(argv)
    if any(c < 0 for c in args.contexts) or min(args.tokens, args.segment, args.replicates) < 1:
        parser.error("--contexts must be >= 0 and --tokens, --segment, --replicates >= 1")
    args.contexts = sorted({*args.contexts, args.mem_len, 0})  # every run's init is scored
    args.eval_every = 0  # (the ablation's runs, as ablation.runs_of names them)
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    runs = ablation.runs_of(args)
    settings = sweep.settings(
        ["experiments.init_best", *(sys.argv[1:] if argv is None else argv)],
        steps=args.steps, sets=list(args.set), contexts=args.contexts, tokens=args.tokens,
        segment=args.segment, replicates=args.replicates, missing=[],
    )  # fmt: skip
    results = {"settings": settings, "runs": []}
    out = pathlib.Path(args.out)
    earlier = sweep.load(out / "init_best.json")
    if args.dry_run:
        print(dry_run(runs, results, earlier, args))
        return
    for (label, mem_len, seed), run in runs.items():
        row = kept(earlier, settings, run)
        if row is None and run.result(args.steps) is not None:
            row = measure(run, label, mem_len, seed, args)
        if row is None:
            settings["missing"].append(run.name)
            continue
        results["runs"].append(row)
        sweep.write(out / "init_best.json", results)
    (out / "init_best.md").write_text(render(results))
    print(render(results))


if __name__ == "__main__":
    main()
