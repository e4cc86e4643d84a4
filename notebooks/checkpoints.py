"""The notebooks' trained models: the checkpoint a sweep left in ``runs/``, rebuilt from the settings
its committed JSON in ``docs/results/earlier/`` records (the 1,000-step sweeps whose runs the
notebooks were written for), or, in smoke mode or where that run is not on this
machine, a small model trained here for a few steps (the notebook then says so).

    model, source = ablation_model("t5", mem_len=0, seed=0, smoke=SMOKE)
    model, source = extrapolation_model("rope", seed=0, smoke=SMOKE)
"""

from __future__ import annotations

import json
import pathlib
import sys
import tempfile

ROOT = pathlib.Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # the sweeps' own run names and configs (experiments/)
    sys.path.insert(0, str(ROOT))

from experiments import common, extrapolation
from relpos_jax.config import load_config
from relpos_jax.evaluate import restore_model

SMOKE_SIZES = ("model.n_layers=1", "model.d_model=32", "model.n_heads=2", "model.d_ff=64")


def _settings(name: str) -> dict:
    path = ROOT / "docs" / "results" / "earlier" / f"{name}.json"
    return json.loads(path.read_text())["settings"]


def _restored(config_file: str, overrides, workdir: pathlib.Path):
    model, _, step = restore_model(load_config(ROOT / config_file, list(overrides)), workdir)
    return model, f"{workdir.relative_to(ROOT)} (step {step})"


def _trained_here(config_file: str, overrides, steps: int):
    """A model trained here (the run the sweep would have made, shrunk in smoke mode)."""
    from relpos_jax.train import Trainer

    config = load_config(ROOT / config_file, list(overrides))
    config.train.update(steps=steps, log_every=steps, eval_every=0, ckpt_every=0)
    trainer = Trainer(config, tempfile.mkdtemp(prefix="relpos_nb_"))
    trainer.run()
    return trainer.current_model(), f"trained here for {steps} steps"


def ablation_model(scheme: str, mem_len: int, seed: int = 0, smoke: bool = False):
    """``(model, where it came from)`` of the ablation sweep's run ``(scheme, memory, seed)``
    (``docs/results/earlier/ablation.md``: 4 layers, d_model 128, segments of 64)."""
    settings = _settings("ablation")
    name = common.run_name(scheme, mem_len, seed)
    workdir = ROOT / "runs" / "ablation" / name
    overrides = common.overrides(mem_len, seed, settings["sets"])
    if not smoke and (workdir / "checkpoints").exists():
        return _restored(common.config_file(scheme), overrides, workdir)
    shrunk = [*overrides, *SMOKE_SIZES, "data.segment_len=16", "data.batch_size=4"]
    return _trained_here(common.config_file(scheme), shrunk if smoke else overrides,
                         5 if smoke else settings["steps"])  # fmt: skip


def train_length(smoke: bool = False) -> int:
    """The extrapolation sweep's training length (16 for the smoke mode's models)."""
    return 16 if smoke else _settings("extrapolation")["train_len"]


def extrapolation_model(scheme: str, seed: int = 0, smoke: bool = False):
    """``(model, where it came from)`` of the extrapolation sweep's run of ``scheme`` with its
    default tables (``docs/results/earlier/extrapolation.md``: trained without memory at its train
    length)."""
    config_file = common.config_file(scheme)
    if smoke:
        tiny = (f"train.seed={seed}", "model.mem_len=0", *SMOKE_SIZES, "data.segment_len=16",
                "data.batch_size=4")  # fmt: skip
        return _trained_here(config_file, tiny, 5)
    settings = _settings("extrapolation")
    train_len = settings["train_len"]
    name = common.extrapolation_run_name(scheme, "defaults", train_len, seed)
    workdir = ROOT / "runs" / "extrapolation" / name
    overrides = (
        f"train.seed={seed}", "model.mem_len=0", f"data.segment_len={train_len}",
        *settings["sets"],
    )  # fmt: skip
    if (workdir / "checkpoints").exists():
        return _restored(config_file, overrides, workdir)
    return _trained_here(config_file, overrides, settings["steps"])


__all__ = ["ROOT", "ablation_model", "extrapolation", "extrapolation_model", "train_length"]
