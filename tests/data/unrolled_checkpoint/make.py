"""Writes this folder with the model of commit 7f351c4, which held its layers one by one
(``blocks/<l>/…``): a checkpoint that the stacked model must still resume, and the numbers it must
reproduce. Run from a checkout of that commit, this folder as the argument:

    git worktree add /tmp/old 7f351c4 && cd /tmp/old
    PYTHONPATH=. python <this file> <this folder> /tmp/unrolled_work
"""

import json
import pathlib
import shutil
import sys

import jax
import numpy as np
from flax import nnx

from relpos_jax import TransformerLM
from relpos_jax.config import load_config
from relpos_jax.sharding import path_string
from relpos_jax.train import Trainer

RUN = dict(n_layers=2, d_model=32, n_heads=2, d_ff=64, mem_len=8, dropout=0.1)
INIT = dict(n_layers=3, d_model=32, n_heads=2, d_ff=64, mem_len=4, dropout=0.1)


def corpus(folder: pathlib.Path) -> pathlib.Path:
    """tests/conftest.py's tiny corpus: 6,000 words drawn with numpy's generator 0."""
    words = ["alpha", "beta", "gamma", "delta", "(", ")", ":", "\n", "    "]
    path = folder / "corpus.txt"
    path.write_text(" ".join(np.random.default_rng(0).choice(words, 6000)))
    return path


def config(work: pathlib.Path):
    c = load_config("configs/txl_small.py")
    c.model.update(**RUN)
    c.data.update(
        name="text", path=str(work / "corpus.txt"), dir=str(work / "tfds"), segment_len=8,
        batch_size=4,
    )  # fmt: skip
    c.train.update(steps=4, log_every=1, eval_every=0, ckpt_every=2, warmup_steps=2)
    return c


def init_abs_sums(position: str) -> dict[str, float]:
    model = TransformerLM(dict(position=position, **INIT), rngs=nnx.Rngs(params=0, dropout=1))
    leaves = jax.tree_util.tree_flatten_with_path(nnx.state(model, nnx.Param))[0]
    return {path_string(p): float(np.abs(np.asarray(a, np.float64)).sum()) for p, a in leaves}


def main(out: pathlib.Path, work: pathlib.Path) -> None:
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    corpus(work)
    Trainer(config(work), work / "full").run()
    Trainer(config(work), work / "half").run(stop_after=2)
    logged = [json.loads(line) for line in (work / "full" / "metrics.jsonl").open()]
    shutil.rmtree(out / "checkpoints", ignore_errors=True)
    shutil.copytree(work / "half" / "checkpoints", out / "checkpoints")
    expected = {
        "written_by": "commit 7f351c4 (layers one by one), with make.py beside this file",
        "run": f"txl_small with {RUN} on tests/conftest.py's tiny corpus; segment 8, batch 4, "
        "warmup 2, 4 steps; checkpoints/2: the same run stopped after step 2",
        "losses": {m["step"]: m["train/loss"] for m in logged if "train/loss" in m},
        "init_abs_sums": {
            "note": f"sum of |w| of every parameter of TransformerLM({INIT}), "
            "nnx.Rngs(params=0, dropout=1)",
            **{position: init_abs_sums(position) for position in ("txl", "shaw")},
        },
    }
    (out / "expected.json").write_text(json.dumps(expected, indent=1) + "\n")


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]).resolve(), pathlib.Path(sys.argv[2]))
