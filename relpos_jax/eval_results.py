"""What evaluation leaves in a run's folder: ``eval.json`` and, beside it, each split's windows.

``save_results`` writes ``relpos_jax.evaluate.run_eval``'s results, the windows (each row of each
segment, or each sliding window: summed bits and scored tokens) in ``eval_windows.npz``;
``load_windows`` reads them back (None for an ``eval.json`` written without them). Until they are
saved, each split's pass keeps its progress in ``eval_<split>.progress.npz`` (``split_progress``).
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
from typing import Any

import jax
import numpy as np

from relpos_jax import evaluate
from relpos_jax.config import Config
from relpos_jax.eval_progress import PassProgress

WINDOWS_FILE = "eval_windows.npz"
"""Each split's windows (``<split>.bits``, ``<split>.tokens``), beside ``eval.json``."""


def save_results(workdir, results: dict[str, Any]) -> pathlib.Path:
    """``eval.json`` in ``workdir`` from ``run_eval``'s ``results`` (plus what the caller added); the
    splits' windows go to ``eval_windows.npz`` beside it, written first and whole (a killed write
    leaves none), and eval.json keeps of them only their file, count and layout: it stays small,
    and an eval.json without them (written before) still reads."""
    workdir = pathlib.Path(workdir)
    arrays, summary = {}, {}
    for key, value in results.items():
        windows = value.get("windows") if isinstance(value, dict) else None
        if isinstance(windows, dict) and "bits" in windows:
            arrays[f"{key}.bits"] = np.asarray(windows["bits"], np.float64)
            arrays[f"{key}.tokens"] = np.asarray(windows["tokens"], np.int64)
            value = {**value, "windows": {
                "file": WINDOWS_FILE, "count": len(windows["bits"]), "layout": windows["layout"],
            }}  # fmt: skip
        summary[key] = value
    if arrays:
        partial = workdir / f"{WINDOWS_FILE}.partial"
        with partial.open("wb") as f:
            np.savez_compressed(f, **arrays)
        partial.replace(workdir / WINDOWS_FILE)
    path = workdir / "eval.json"
    path.write_text(json.dumps(summary, indent=2) + "\n")
    return path


def load_windows(workdir, split: str) -> dict[str, Any] | None:
    """``{"bits", "tokens", "layout"}`` of ``split`` as ``save_results`` wrote them in ``workdir``;
    None where its eval.json has none (written before windows were kept) or the file they are in is
    missing or does not match eval.json."""
    workdir = pathlib.Path(workdir)
    done = workdir / "eval.json"
    if not done.exists():
        return None
    entry = (json.loads(done.read_text()).get(split) or {}).get("windows")
    if not isinstance(entry, dict) or not (workdir / entry.get("file", "")).is_file():
        return None
    with np.load(workdir / entry["file"]) as arrays:
        if f"{split}.bits" not in arrays:
            return None
        bits, tokens = arrays[f"{split}.bits"], arrays[f"{split}.tokens"]
    if len(bits) != entry["count"] or len(tokens) != entry["count"]:
        return None
    return {"bits": bits, "tokens": tokens, "layout": entry["layout"]}


def split_progress(workdir, config: Config, split: str, step: int) -> PassProgress:
    """Where ``eval.py``'s pass over ``split`` keeps its progress until ``eval.json`` is saved:
    ``eval_<split>.progress.npz`` in ``workdir``, taken up only by a pass of the same checkpoint
    step, split, evaluation settings, model config, data and devices."""
    key = {
        "split": split, "step": step,
        "settings": dataclasses.asdict(evaluate.EvalSettings.of(config)),
        "model": dataclasses.asdict(config.model),
        "data": [config.data.name, config.data.partition, config.data.corpus_python],
        "devices": jax.device_count(),
    }  # fmt: skip
    name = json.dumps(key, sort_keys=True, default=str)
    return PassProgress(pathlib.Path(workdir) / f"eval_{split}.progress.npz", name)


def going_on(killed: str, progress: dict[str, PassProgress]) -> str:
    """The first line of an evaluation run again after one (started ``killed``) did not finish:
    where each split's pass goes on from (``progress``: ``split_progress`` of each split)."""
    kept = {split: p.resumed()[1] for split, p in progress.items()}
    tokens = {split: int(sums[0]["row_count"].sum()) for split, sums in kept.items() if sums}
    if not tokens:
        return (
            f"restarting the evaluation from the first token: the one started {killed} did not "
            "finish and had kept no scores"
        )
    where = ", ".join(
        f"{split} after its {tokens[split]:,} tokens scored" if split in tokens
        else f"{split} from the first token" for split in progress
    )  # fmt: skip
    return f"going on with the evaluation started {killed}: {where}"
