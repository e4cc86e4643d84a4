"""The Transformer-XL paper's Table 6 at small scale: every position scheme × {memory, no memory}.

    .venv/bin/python -m bench.ablation [--steps 500] [--schemes txl,shaw,...] [--seed 0]
        [--mem-len 128] [--set model.n_layers=12 ...]   # any config override, applied to every run

Trains ``configs/<scheme>_small.py`` (txl_small's sizes, data and hyperparameters; only the position
scheme differs) with memory (``--mem-len``, 128) and with ``mem_len`` 0, equal steps, on the embedded pystdlib
corpus, each with ``train.py`` then ``eval.py --splits test`` (every test token once, memory as
trained). Finished runs under ``runs/ablation/`` are reused. Writes ``docs/results/ablation.md`` (test
bpc, with the paper's WikiText-103 perplexities beside for reference) and ``ablation.png``.
"""

from __future__ import annotations

import json
import pathlib
import subprocess
import sys

from bench import args as options
from bench.measure import ROOT
from relpos_jax.config import POSITIONS, load_config

# The schemes compared: every one that encodes positions ("none", the baseline without any, runs
# when named: --schemes none).
SCHEMES = tuple(p for p in POSITIONS if p != "none")
PAPER = {  # Dai et al. 2019, Table 6: WikiText-103 test perplexity, 128M parameters, length 128
    ("txl", True): "27.02",
    ("shaw", True): "27.94",
    ("txl", False): "29.59",
    ("shaw", False): "29.75",
    ("sinusoid", False): "30.97 (Vaswani et al., half loss)",
    ("learned", False): "31.16 (Al-Rfou et al., half loss)",
}


def config_file(scheme: str) -> str:
    return "configs/txl_small.py" if scheme == "txl" else f"configs/{scheme}_small.py"


def overrides(mem_len: int, seed: int, sets=()) -> list[str]:
    """The config overrides of one run (``--set`` ones last, so that they win)."""
    return [f"model.mem_len={mem_len}", f"train.seed={seed}", *sets]


def config_for(scheme: str, mem_len: int, seed: int, sets=()):
    """The ConfigDict of one run, as its ``train.py`` flags build it (for in-process evaluation)."""
    return load_config(ROOT / config_file(scheme), overrides(mem_len, seed, sets))


def run(scheme: str, mem_len: int, steps: int, seed: int, runs: pathlib.Path, sets=()) -> dict:
    workdir = runs / f"{scheme}_mem{mem_len}_seed{seed}"
    done = workdir / "eval.json"
    if done.exists() and json.loads(done.read_text()).get("step") == steps:
        return json.loads(done.read_text())
    settings = [f"train.steps={steps}", "train.eval_every=0", *overrides(mem_len, seed, sets)]
    flags = [
        "--config", config_file(scheme), "--workdir", str(workdir),
        *(f"--config.{s}" for s in settings),
    ]  # fmt: skip
    subprocess.run([sys.executable, "train.py", *flags], cwd=ROOT, check=True)
    subprocess.run([sys.executable, "eval.py", *flags, "--splits", "test"], cwd=ROOT, check=True)
    return json.loads(done.read_text())


def plot(results: dict, path: pathlib.Path) -> None:
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7, 3.6), layout="constrained")
    ax = fig.add_subplot()
    schemes = sorted({s for s, _ in results}, key=POSITIONS.index)
    width = 0.4
    for i, mem_len in enumerate(sorted({m for _, m in results}, reverse=True)):
        values = [results.get((s, mem_len), float("nan")) for s in schemes]
        xs = [k + (i - 0.5) * width for k in range(len(schemes))]
        ax.bar(xs, values, width, label=f"memory {mem_len}")
    ax.set_xticks(range(len(schemes)), schemes)
    ax.set_ylabel("test bpc (pystdlib)")
    low = min(v for v in results.values())
    ax.set_ylim(low - 0.1, max(results.values()) + 0.05)
    ax.legend()
    fig.savefig(path, dpi=120)


def main() -> None:
    parser = options.parser(__doc__)
    parser.add_argument("--steps", type=int, default=500)
    options.add_schemes(parser, SCHEMES)
    options.add_seed(parser)
    parser.add_argument("--mem-len", type=int, default=128, help="the memory runs' mem_len")
    options.add_runs(parser, "runs/ablation")
    options.add_out(parser)
    options.add_overrides(parser)
    args = parser.parse_args()
    results = {}
    for scheme in args.schemes:
        for mem_len in (args.mem_len, 0):
            evaluated = run(
                scheme, mem_len, args.steps, args.seed, pathlib.Path(args.runs), args.set
            )
            results[(scheme, mem_len)] = evaluated["test"]["bpc"]
    lines = [
        "| scheme | memory | test bpc | paper (WT103 test ppl) |",
        "|---|---:|---:|---|",
        *(
            f"| {s} | {m} | {bpc:.4f} | {PAPER.get((s, m > 0), '')} |"
            for (s, m), bpc in sorted(results.items(), key=lambda kv: kv[1])
        ),
    ]
    print("\n".join(lines))
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plot(results, out / "ablation.png")
    (out / "ablation.json").write_text(
        json.dumps({f"{s}/mem{m}": v for (s, m), v in results.items()}, indent=1) + "\n"
    )


if __name__ == "__main__":
    main()
