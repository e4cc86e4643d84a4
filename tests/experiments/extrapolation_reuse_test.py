"""``experiments.extrapolation`` reuses the rows its JSON holds for runs whose folders are gone (a
sweep gone on to another machine, a cleaned disk) where they were scored with the same settings:
a run only with every row it gives, a fine-tune only with the same fine-tuning and with the run it
started from, each row naming where it was measured in the table."""

from __future__ import annotations

import argparse
import json

from experiments import extrapolation, extrapolation_tables, sweep
from relpos_jax.config import defaults
from relpos_jax.data import corpora

SCORING = {  # the settings extrapolation.main keeps with the rows and compares
    "train_len": 16, "steps": 10, "lengths": [16, 32, 64], "tokens": 4096, "stride": None,
    "extensions_up_to": 4, "yarn": {"beta_fast": 0.125, "beta_slow": 0.00390625},
    "sliding_up_to": 32, "models": "ablation", "sets": ["model.n_layers=1"],
}  # fmt: skip
FINE_TUNING = {"pi_steps": 2, "fine_tune": ["linear"], "pi_factors": [2, 4]}
AT = {"commit": "abc1234", "machine": "AMD EPYC, 2 cores", "date": "2026-12-06"}


def _args(tmp_path, **changed) -> argparse.Namespace:
    return argparse.Namespace(
        schemes=["txl", "rope"], seeds=[0], runs=str(tmp_path / "runs"), out=str(tmp_path / "out"),
        steps=10, set=["model.n_layers=1"], models="ablation", variants=["defaults"],
        train_len=16, factors=[1, 2, 4], extensions_up_to=4, pi_steps=2, fine_tune=("linear",),
        sliding_up_to=SCORING["sliding_up_to"], **changed,
    )  # fmt: skip


def _row(scheme: str, label: str, lengths: list[int]) -> dict:
    bpc = {  # sliding windows up to sliding_up_to, as extrapolation_scoring.protocols_at
        "non-overlapping": {str(n): 2.0 + n / 100 for n in lengths},
        "sliding": {str(n): 1.9 + n / 100 for n in lengths if n <= SCORING["sliding_up_to"]},
    }
    return {"scheme": scheme, "variant": "defaults", "seed": 0, "label": label, "bpc": bpc,
            "bpc_windows": {}}  # fmt: skip


def _rows() -> list[dict]:
    base = [_row(scheme, label, [16, 32, 64]) for scheme in ("txl", "rope")
            for label, _ in extrapolation.labels_of(scheme)]  # fmt: skip
    tuned = [_row("rope", extrapolation.PI_LABEL, [32]),
             _row("rope", extrapolation.past_label("linear"), [64]),
             _row("rope", extrapolation.PI_LABEL, [64])]  # fmt: skip
    return base + tuned


def _write(tmp_path, rows: list[dict], **settings) -> None:
    s = sweep.settings(["experiments.extrapolation"], **SCORING, **FINE_TUNING) | AT | settings
    sweep.write(tmp_path / "out" / "extrapolation.json", {"settings": s, "runs": rows})


def _reusable(args):
    runs = extrapolation.runs_of(args)
    fine_tunes = extrapolation.fine_tune_runs_of(args, runs)
    return extrapolation.reusable_rows(args, runs, fine_tunes, **SCORING)


def test_runs_whose_folders_are_gone_reuse_every_row_they_gave_with_where_it_was_measured(tmp_path):
    _write(tmp_path, _rows())
    base, tuned = _reusable(_args(tmp_path))
    assert sorted(base) == [("rope", "defaults", 0), ("txl", "defaults", 0)]
    labels = [row["label"] for row in base["rope", "defaults", 0]]
    assert labels == [label for label, _ in extrapolation.labels_of("rope")]  # RoPE's extensions
    assert all(row["commit"] == "abc1234" for row in base["rope", "defaults", 0])
    assert sorted(tuned) == [("linear", 2, 0), ("linear", 4, 0)]
    at_2 = tuned["linear", 2, 0]  # its length and twice it, not the 4× fine-tune's row at 64
    assert [(row["label"], list(row["bpc"]["non-overlapping"])) for row in at_2] == [
        (extrapolation.PI_LABEL, ["32"]), (extrapolation.past_label("linear"), ["64"])
    ]  # fmt: skip
    assert [list(row["bpc"]["non-overlapping"]) for row in tuned["linear", 4, 0]] == [["64"]]


def test_a_finished_folder_a_missing_row_or_other_settings_are_scored_again(tmp_path):
    rows = [row for row in _rows() if row["label"] != "rope+yarn"]  # one of RoPE's rows lost
    _write(tmp_path, rows)
    args = _args(tmp_path)
    txl = extrapolation.runs_of(args)["txl", "defaults", 0]
    txl.workdir.mkdir(parents=True)  # finished here: its folder wins over the JSON
    corpus = {"partition": defaults().data.partition, "python": corpora.running_python()}
    finished = {"step": 10, "test": {"bpc": 2.0}, "data": corpus}
    (txl.workdir / "eval.json").write_text(json.dumps(finished))
    assert txl.result(10) is not None
    base, tuned = _reusable(args)
    assert base == tuned == {}  # RoPE trained again: its fine-tunes too, from the new model
    _write(tmp_path, _rows(), tokens=8192)  # scored on other tokens
    assert _reusable(_args(tmp_path)) == ({}, {})
    _write(tmp_path, _rows(), pi_steps=5)  # fine-tuned longer: the models alone are reused
    base, tuned = _reusable(_args(tmp_path))
    assert ("rope", "defaults", 0) in base and tuned == {}


def test_a_run_whose_rows_were_tabulated_before_every_cell_was_scored_is_scored_again(tmp_path):
    rows = _rows()  # as --scored-only writes a table partway: txl's sliding window at 32 not yet
    del next(row for row in rows if row["label"] == "txl")["bpc"]["sliding"]["32"]
    _write(tmp_path, rows)
    base, _ = _reusable(_args(tmp_path))
    assert sorted(base) == [("rope", "defaults", 0)]
    for row in rows:  # RoPE's own row without its longest length
        if row["label"] == "rope":
            del row["bpc"]["non-overlapping"]["64"]
    _write(tmp_path, rows)
    assert _reusable(_args(tmp_path)) == ({}, {})  # and its fine-tunes with it


def test_the_table_names_the_commit_its_reused_rows_were_measured_at(tmp_path):
    _write(tmp_path, _rows())
    base, tuned = _reusable(_args(tmp_path))
    settings = sweep.settings(["experiments.extrapolation"], **SCORING, **FINE_TUNING, seeds=[0])
    rows = [row for found in (base, tuned) for rows in found.values() for row in rows]
    table = extrapolation_tables.render(
        {"settings": settings | {"commit": "def5678"}, "runs": rows}
    )
    assert "Reused from the JSON of commit abc1234 (AMD EPYC, 2 cores, 2026-12-06): txl: seed 0; " \
        "rope: seed 0." in table  # fmt: skip
    assert "Reused" not in extrapolation_tables.render({"settings": settings, "runs": _rows()})


def test_the_rows_keep_the_sweeps_order_whichever_runs_were_scored_here(tmp_path):
    _write(tmp_path, _rows())
    args = _args(tmp_path)
    runs = extrapolation.runs_of(args)
    fine_tunes = extrapolation.fine_tune_runs_of(args, runs)
    base, tuned = extrapolation.reusable_rows(args, runs, fine_tunes, **SCORING)
    rope = ("rope", "defaults", 0)
    scored_here = {rope: base.pop(rope)}  # TXL's reused
    rows = extrapolation.in_sweep_order((runs, base, scored_here), (fine_tunes, tuned, {}))
    listed = [(row["scheme"], row["label"], row["bpc"]["non-overlapping"]) for row in rows]
    written = [(row["scheme"], row["label"], row["bpc"]["non-overlapping"]) for row in _rows()]
    assert listed == written  # TXL first (--schemes), then RoPE, then its fine-tunes
