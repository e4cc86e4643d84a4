"""A run's learning curve as a markdown table and a PNG, from its ``metrics.jsonl``.

.venv/bin/python -m experiments.learning_curve runs/txl_small docs/results/txl_small_curve.png
"""

from __future__ import annotations

import pathlib

from bench import args as options
from relpos_jax.metrics import read_metrics


def main() -> None:
    parser = options.parser(__doc__)
    parser.add_argument("workdir", nargs="+", help="one or more work directories")
    parser.add_argument("png", help="where to write the plot")
    args = parser.parse_args()
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axis = plt.subplots(figsize=(7, 4))
    for workdir in args.workdir:
        records = read_metrics(workdir)
        train = [(r["step"], r["train/bpc"]) for r in records if "train/bpc" in r]
        valid = [(r["step"], r["valid/bpc"]) for r in records if "valid/bpc" in r]
        name = pathlib.Path(workdir).name
        print(f"\n{name}\n\n| step | train bpc | valid bpc |\n|---:|---:|---:|")
        valid_at = dict(valid)
        for step, bpc in train:
            cell = f"{valid_at[step]:.4f}" if step in valid_at else ""
            print(f"| {step} | {bpc:.4f} | {cell} |")
        axis.plot(*zip(*train, strict=True), label=f"{name} train")
        if valid:
            axis.plot(*zip(*valid, strict=True), "o--", label=f"{name} valid")
    axis.set_xlabel("step")
    axis.set_ylabel("bits per byte")
    axis.set_ylim(top=4.0)
    axis.grid(alpha=0.3)
    axis.legend()
    figure.tight_layout()
    figure.savefig(args.png, dpi=120)


if __name__ == "__main__":
    main()
