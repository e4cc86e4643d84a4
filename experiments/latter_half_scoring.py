"""The ablation's test bpc on the latter half of each segment, with its windows: where a model trained
on Dai et al.'s half loss (``train.loss_from``) was trained, and where every model without memory
sees half a segment of context or more (Table 6's comparison of absolute and relative encodings).

A run's latter half is scored as its ``eval.py --splits test`` scored the whole (the same segments,
rows and tokens, ``EvalSettings``), counting only the targets at offset ``segment_len // 2`` or
later of each segment (``evaluate(scored_from=…)``). Its windows are kept in the run's folder
(``latter_half.npz``, written whole and renamed into place) with what identifies the training they
measured (``recl.trained``): a run trained again is scored again. So the rows of the ablation's
half-loss table carry bootstrap intervals, paired on the same windows.
"""

from __future__ import annotations

import json

import numpy as np

from bench.measure import ROOT
from experiments import sweep
from experiments.recl import trained
from relpos_jax.config import load_config
from relpos_jax.files import replace_whole

FILE = "latter_half.npz"


def windows(run: sweep.Run) -> dict | None:
    """``{"bits", "tokens", "layout"}`` of ``run``'s test split on the latter half of each segment
    (from its folder where scored before for this training, else measured now); None for a run
    without a finished training."""
    measured = trained(run.workdir)
    if measured is None:
        return None
    path = run.workdir / FILE
    if path.is_file():
        with np.load(path) as kept:
            if json.loads(str(kept["trained"])) == measured:
                return {
                    "bits": kept["bits"],
                    "tokens": kept["tokens"],
                    "layout": str(kept["layout"]),
                }
    found = _measure(run)
    replace_whole(path, lambda f: np.savez_compressed(
        f, bits=found["bits"], tokens=found["tokens"], layout=found["layout"],
        trained=json.dumps(measured),
    ))  # fmt: skip
    return found


def _measure(run: sweep.Run) -> dict:
    from relpos_jax.evaluate import EvalSettings, evaluate_split, restore_model

    config = load_config(ROOT / run.config, list(run.settings))
    model, cfg, _ = restore_model(config, run.workdir)
    settings = EvalSettings.of(cfg)
    result = evaluate_split(
        model, cfg, "test", settings=settings, scored_from=settings.segment_len // 2
    )
    print(f"  {run.name}: latter half {result['bpc']:.4f}", flush=True)
    return result["windows"]
