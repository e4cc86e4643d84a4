"""``python -m relpos_jax.convert huggingface|tensorflow …``: a released model -> a run directory.

    python -m relpos_jax.convert huggingface --source transfo-xl-wt103/ --workdir runs/txl_wt103_hf
    python -m relpos_jax.convert tensorflow --source pretrained_xl/tf_wt103/model/model.ckpt-0 \\
        --config configs/txl_large_wt103.py --workdir runs/txl_wt103_tf

Mistakes (a missing folder or file, a tensor of the wrong shape, a missing variable, torch or
TensorFlow not installed) end in one line naming the thing and the fix, exit code 2.
"""

from __future__ import annotations

import argparse
import math
import pathlib
import sys

from relpos_jax.config import ConfigError, load_config
from relpos_jax.convert.common import ConvertError


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m relpos_jax.convert", description=__doc__.split("\n")[0]
    )
    routes = parser.add_subparsers(dest="route", required=True)
    hf = routes.add_parser("huggingface", help="a HuggingFace transfo-xl folder")
    hf.add_argument("--source", required=True, help="folder with config.json and the weights")
    hf.add_argument("--workdir", required=True, help="the run directory to write")
    hf.add_argument(
        "--config",
        help="config whose data/eval/train sections the run keeps (default configs/base.py's); "
        "the model fields come from config.json",
    )
    tf = routes.add_parser("tensorflow", help="an official TensorFlow checkpoint")
    tf.add_argument("--source", required=True, help="checkpoint prefix (…/model.ckpt-0) or folder")
    tf.add_argument(
        "--config", required=True, help="the model's settings, e.g. configs/txl_large_wt103.py"
    )
    tf.add_argument("--workdir", required=True, help="the run directory to write")
    tf.add_argument(
        "--override", action="append", default=[], metavar="FIELD=VALUE",
        help="a config override such as model.mem_len=1600 (repeatable)",
    )  # fmt: skip
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.route == "huggingface":
            from relpos_jax.convert import huggingface

            base = load_config(args.config) if args.config else None
            written = huggingface.convert(args.source, args.workdir, base)
        else:
            from relpos_jax.convert import tensorflow

            config = load_config(args.config, args.override)
            written = tensorflow.convert(args.source, config, args.workdir)
    except (ConvertError, ConfigError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    import jax
    from flax import nnx

    count = sum(math.prod(p.shape) for p in jax.tree.leaves(nnx.state(written["model"], nnx.Param)))
    workdir = pathlib.Path(args.workdir)
    print(f"converted {args.source} -> {workdir}: {count:,} parameters, config {written['config']}")
    if written["vocab"] is not None:
        print(f"vocabulary: {written['vocab']} (one token a line, the line index its id)")
    print(f"evaluate: python eval.py --config {written['config']} --workdir {workdir}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
