"""``experiments.init_best``: its table rendered from a small JSON, its dry run, a killed sweep
resumed, and one run measured end to end (a tiny model scored as it was trained)."""

from __future__ import annotations

import json
import types

import pytest

from experiments import ablation, init_best, sweep


def _row(scheme: str, memory: int, seed: int, best: int, gain: list[float]) -> dict:
    bpc = {str(memory): 2.0 + 0.01 * seed, str(best): 2.0 + 0.01 * seed + gain[0]}
    return {"run": f"{scheme}_mem{memory}_seed{seed}", "scheme": scheme, "memory": memory,
            "seed": seed, "init": memory, "best": best, "bpc": bpc, "gain": gain,
            "trained": {"step": 10, "test_bpc": 2.0}}  # fmt: skip


def _results(runs: list[dict], **settings) -> dict:
    s = sweep.settings(["experiments.init_best", "--schemes", "txl,shaw"], contexts=[0, 64, 128],
                       tokens=1024, segment=16, replicates=500, missing=[])  # fmt: skip
    return {"settings": s | settings, "runs": runs}


def test_the_table_gives_each_scheme_its_init_best_and_gain_with_the_papers_figures():
    runs = [_row("txl", 64, 0, 128, [-0.03, -0.04, -0.02]),
            _row("txl", 64, 1, 64, [0.0, 0.0, 0.0]),
            _row("shaw", 64, 0, 64, [0.0, 0.0, 0.0])]  # fmt: skip
    table = init_best.render(_results(runs, missing=["shaw_mem64_seed1"]))
    assert "`python -m experiments.init_best --schemes txl,shaw`" in table
    assert "at c = 0, 64, 128" in table and "blocks of 16 tokens, 500 replicates" in table
    assert "| txl | 64 | 2 | 2.0050 | ≥128, 64 | 1.9900 | -0.0150 | 1 of 2 | 27.02 / 26.77 / 500 |" \
        in table  # fmt: skip
    assert "| shaw | 64 | 1 | 2.0000 | 64 | 2.0000 | +0.0000 | 0 of 1 | 27.94 / 27.94 / 256 |" \
        in table  # fmt: skip
    assert table.index("| txl |") < table.index("| shaw |")  # by best bpc
    assert "or its folder is gone): shaw_mem64_seed1." in table
    assert "Reused" not in table  # every row measured at this commit
    older = {"commit": "abc1234", "machine": "AMD EPYC, 2 cores", "date": "2026-12-06"}
    table = init_best.render(_results([runs[0] | older, runs[1] | older, runs[2]]))
    assert "Reused from the JSON of commit abc1234 (AMD EPYC, 2 cores, 2026-12-06): txl, memory " \
        "64: seeds 0, 1." in table  # fmt: skip


def _args(tmp_path, *flags: str):
    return init_best.parse(["--schemes", "txl", "--mem-len", "8", "--seeds", "0", "--steps", "10",
                            "--runs", str(tmp_path), "--out", str(tmp_path / "out"), *flags])  # fmt: skip


def test_the_grid_always_holds_each_runs_init(tmp_path):
    assert _args(tmp_path, "--contexts", "32,16").contexts == [0, 8, 16, 32]


def test_the_dry_run_lists_each_run_and_how_to_train_the_missing_ones(tmp_path, capsys):
    (tmp_path / "txl_mem8_seed0" / "checkpoints").mkdir(parents=True)
    init_best.main(["--schemes", "txl", "--mem-len", "8", "--seeds", "0", "--steps", "10", "--runs",
                    str(tmp_path), "--out", str(tmp_path / "out"), "--dry-run"])  # fmt: skip
    printed = capsys.readouterr().out
    assert "txl_mem8_seed0 (txl, with memory c): to measure" in printed
    assert "txl_mem0_seed0 (txl, in windows): not trained" in printed
    assert "train the missing runs first: python -m experiments.ablation --schemes txl --mem-len 8 " \
        "--steps 10 --seeds 0" in printed  # fmt: skip
    assert not (tmp_path / "out").exists()  # measures and writes nothing


def test_a_killed_sweep_keeps_the_runs_it_measured_while_they_are_unchanged(tmp_path):
    args = _args(tmp_path)
    run = ablation.runs_of(args)["txl", 8, 0]
    run.workdir.mkdir()
    (run.workdir / "eval.json").write_text(json.dumps({"step": 10, "test": {"bpc": 2.0}}))
    settings = {"contexts": args.contexts, "tokens": args.tokens, "segment": args.segment,
                "replicates": args.replicates, "partition": "dedup", "python": "3.11"}  # fmt: skip
    at = {"commit": "abc1234", "machine": "AMD EPYC, 2 cores", "date": "2026-12-06"}
    earlier = {"settings": settings | at, "runs": [_row("txl", 8, 0, 8, [0.0, 0.0, 0.0])]}
    row = earlier["runs"][0] | at  # where it was measured goes with it
    assert init_best.kept(earlier, settings, run) == row
    assert init_best.kept(earlier, settings | {"tokens": 2048}, run) is None  # other settings
    assert init_best.kept(earlier, settings | {"partition": "hash"}, run) is None  # other corpus
    (run.workdir / "eval.json").write_text(json.dumps({"step": 10, "test": {"bpc": 2.5}}))
    assert init_best.kept(earlier, settings, run) is None  # retrained: measured again
    (run.workdir / "eval.json").unlink()
    run.workdir.rmdir()
    assert init_best.kept(earlier, settings, run) == row  # its folder gone: kept
    kept_before = {"settings": settings | {"commit": "def5678"}, "runs": [row]}
    assert init_best.kept(kept_before, settings, run) == row  # kept again: still its own commit


@pytest.mark.parametrize("mem_len", [8, 0])
def test_a_run_is_measured_as_it_was_trained(tiny, tmp_path, monkeypatch, mem_len):
    from relpos_jax import evaluate
    from relpos_jax.config import Config
    from tests.helpers import tiny_model

    config, _ = tiny
    cfg = Config.from_any(config)
    model = tiny_model("txl", n_layers=1, mem_len=mem_len)
    monkeypatch.setattr(evaluate, "restore_model", lambda *_: (model, cfg, 10))
    monkeypatch.setattr(init_best, "load_config", lambda *_: config)
    args = types.SimpleNamespace(contexts=[0, 8, 16], tokens=96, segment=8, replicates=100)
    run = sweep.Run(f"txl_mem{mem_len}_seed0", tmp_path, "configs/txl_small.py", ())
    row = init_best.measure(run, "txl", mem_len, 0, args)
    assert row["scoring"] == ("memory" if mem_len else "window") and row["init"] == mem_len
    assert sorted(row["bpc"]) == ["0", "16", "8"] and row["trained"] is None
    point, lo, hi = row["gain"]
    assert point == pytest.approx(row["bpc"][str(row["best"])] - row["bpc"][str(mem_len)])
    assert row["bpc"][str(row["best"])] == min(row["bpc"].values())
    assert lo <= point <= hi and (row["best"] != mem_len or row["gain"] == [0.0, 0.0, 0.0])
