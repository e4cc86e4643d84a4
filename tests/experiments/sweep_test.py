"""The sweeps' shared pieces (``experiments.sweep``) and the ablation's table, rendered from a small JSON
without training anything; its runs listed as command lines (``--dry-run``)."""

from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys

import pytest

from experiments import ablation, compare, sweep
from tests.helpers import ROOT


def test_mean_and_spread():
    assert compare.mean_sd([2.0]) == (2.0, 0.0)
    mean, sd = compare.mean_sd([1.0, 2.0, 3.0])
    assert mean == pytest.approx(2.0) and sd == pytest.approx(1.0)
    assert compare.apart([1.0, 1.1, 1.2], [2.0, 2.1, 2.2])  # 1.0 apart, spreads 0.1
    assert not compare.apart([1.0, 1.5, 2.0], [1.6, 2.1, 2.6])  # 0.6 apart, spreads 0.5
    assert not compare.apart([1.0], [3.0])  # one seed: no claim


def _results() -> dict:
    bpc = {
        ("txl", 64): [2.00, 2.01, 2.02], ("txl", 0): [2.10, 2.11, 2.12],
        ("shaw", 64): [2.30, 2.50, 2.40], ("shaw", 0): [2.36, 2.46, 2.41],
    }  # fmt: skip
    settings = sweep.settings(["experiments.ablation", "--seeds", "0,1,2"], steps=10, mem_len=64,
                              seeds=[0, 1, 2], schemes=["txl", "shaw"], sets=[])  # fmt: skip
    runs = [
        {"scheme": s, "memory": m, "seed": seed, "workdir": "runs/x", "test_bpc": v}
        for (s, m), values in bpc.items() for seed, v in enumerate(values)
    ]  # fmt: skip
    return {"settings": settings, "runs": runs}


def test_the_ablation_table_is_rendered_from_its_json_with_spreads():
    table = ablation.render(_results())
    assert "`python -m experiments.ablation --seeds 0,1,2`" in table
    rows = [line for line in table.splitlines() if line.startswith(("| txl", "| shaw"))]
    assert rows[0] == "| txl | 64 | 2.0100 ± 0.0100 | 3 | 27.02 |"  # the lowest first
    assert rows[-1] == "| shaw | 0 | 2.4100 ± 0.0500 | 3 | 29.75 |"
    assert "- txl: memory lowers test bpc by 0.1000" in table  # 0.1 apart, spreads 0.01
    assert "- shaw: memory" not in table  # 0.01 apart, spreads 0.05 and 0.1
    assert "- txl (memory 0) lower than shaw (memory 64), next" in table  # 2.11 vs 2.40
    assert "- shaw (memory 64) lower" not in table


def test_the_ablation_compares_a_half_loss_row_on_the_positions_it_trained_on():
    results = _results()
    assert "latter half" not in ablation.render(results)  # no half-loss row: no such table
    for run in results["runs"]:
        run["bpc_by_position"] = [3.0, 3.0, run["test_bpc"], run["test_bpc"]]
    results["runs"] += [
        {"scheme": "sinusoid+half", "memory": 0, "seed": seed, "workdir": "runs/x",
         "test_bpc": 2.5, "bpc_by_position": [4.0, 4.0, 1.90 + 0.01 * seed, 1.90]}
        for seed in range(3)
    ]  # fmt: skip
    table = ablation.render(results)
    assert (
        "| sinusoid+half | 0 | 2.5000 ± 0.0000 | 3 | 30.97 (Vaswani et al., half loss) |" in table
    )
    half = table.split("test bpc, latter half of each segment |")[1].splitlines()
    assert half[2] == "| sinusoid+half | 0 | 1.9050 ± 0.0050 |"  # the lowest there
    assert half[3] == "| txl | 0 | 2.1100 ± 0.0100 |"
    assert not any(line.startswith("| txl | 64") for line in half[:5])  # rows without memory


def test_the_half_loss_table_gives_intervals_where_the_runs_kept_latter_half_windows():
    import numpy as np

    results = _results()
    results["runs"] += [
        {"scheme": "sinusoid+half", "memory": 0, "seed": seed, "workdir": "runs/x", "test_bpc": 2.5}
        for seed in range(3)
    ]
    hard = np.random.default_rng(0).gamma(4.0, 0.5, 40)  # each window's difficulty, per token
    for run in results["runs"]:
        run["bpc_by_position"] = [9.0, 9.0, 9.0, 9.0]  # not read where windows are kept
        if run["memory"] == 0:
            margin = 0.3 if run["scheme"] == "shaw" else 0.0
            bits = (hard + margin + 0.01 * run["seed"]) * 32
            layout = "segments of 64, 4 rows, 1280 targets from offset 32"
            run["latter_half_windows"] = {"bits": bits, "tokens": np.full(40, 32), "layout": layout}
    table = ablation.render(results)
    half = table.split("test bpc, latter half of each segment |")[0].splitlines()[-3]
    assert "bootstrap interval" in half and "the 40 windows (segments of 64" in half
    rows = table.split("test bpc, latter half of each segment |")[1].splitlines()[2:5]
    point = float(np.mean(hard)) + 0.01
    assert rows[0].startswith(f"| sinusoid+half | 0 | {point:.4f} [") or rows[0].startswith(
        f"| txl | 0 | {point:.4f} ["
    )
    assert rows[2].startswith(f"| shaw | 0 | {point + 0.3:.4f} [")  # the highest, 0.3 above
    shaw = [r for r in results["runs"] if r["scheme"] == "shaw" and r["memory"] == 0]
    values, windows = ablation.latter_halves(shaw)
    assert values[0] == pytest.approx(float(np.mean(hard)) + 0.3, rel=1e-12) and len(windows) == 3


def test_the_ablation_tabulates_memorys_effect_as_training_grows():
    results = _results()
    results["settings"]["eval_tokens"] = 4096
    gains = {"txl": (0.01, -0.05), "shaw": (0.2, 0.0)}  # memory − none at steps 10, 20
    for run in results["runs"]:
        shift = gains[run["scheme"]] if run["memory"] else (0.0, 0.0)
        noise = 0.001 * run["seed"]
        run["valid_by_step"] = [(10, 2.0 + shift[0] + noise), (20, 1.9 + shift[1] + noise)]
    table = ablation.render(results)
    assert "| scheme | step 10 | step 20 |" in table
    assert "| txl | +0.0100 * | -0.0500 * |" in table  # spreads 0.001: both beyond 2 sd
    assert "| shaw | +0.2000 * | +0.0000 |" in table
    assert "the first 4,096 valid tokens" in table
    for run in results["runs"]:
        run["valid_by_step"] = run["valid_by_step"][-1:]  # one validation: no such table
    assert "| step" not in ablation.render(results)


def test_the_ablation_plots_loss_against_position_from_its_json(tmp_path):
    results = _results()
    for run in results["runs"]:  # memory lowers the first positions' loss
        run["bpc_by_position"] = [run["test_bpc"] + (0.5 if run["memory"] == 0 else 0.1) / (t + 1)
                                  for t in range(8)]  # fmt: skip
    ablation.plot_positions(results, tmp_path / "positions.png")
    assert (tmp_path / "positions.png").stat().st_size > 10_000
    del results["runs"][0]["bpc_by_position"]  # an eval.json from before: that run is left out
    ablation.plot_positions(results, tmp_path / "fewer.png")
    assert (tmp_path / "fewer.png").exists()


def test_the_ablation_lists_its_runs_as_command_lines():
    flags = ["--dry-run", "--schemes", "txl,rope", "--seeds", "0,1", "--steps", "5"]
    result = subprocess.run(
        [sys.executable, "-m", "experiments.ablation", *flags, "--runs", "runs/sweep"],
        capture_output=True, text=True, timeout=120, check=True, cwd=ROOT,
    )  # fmt: skip
    runs = [line.split(" && ") for line in result.stdout.splitlines()]
    assert len(runs) == 2 * 2 * 2  # schemes × memory × seeds, each train.py && eval.py
    lines = [shlex.split(command) for run in runs for command in run]
    assert [line[1] for line in lines[:2]] == ["train.py", "eval.py"]
    assert "--config.train.seed=1" in lines[2] and "--config.model.mem_len=128" in lines[2]
    assert lines[-1][lines[-1].index("--config") + 1] == "configs/rope_small.py"
    assert lines[-1][-2:] == ["--splits", "test"]


def test_the_probe_table_is_rendered_from_its_json_with_spreads():
    from experiments import probes

    accuracy = {  # (scheme, condition) -> per seed, accuracy at distances 8 and 32
        ("txl", "memory"): [(1.0, 0.9), (1.0, 0.7)],
        ("alibi", "memory"): [(0.1, 0.1), (0.12, 0.08)],
        ("alibi", "in_segment"): [(0.6, 0.1), (0.2, 0.1)],  # 0.4 ± 0.28: not beyond 2 sd
    }
    settings = sweep.settings(
        ["experiments.probes", "--seeds", "0,1"], config="configs/probe_needle.py", kind="needle",
        steps=10, segment_len=16, mem_len=48, seeds=[0, 1], schemes=["txl", "alibi"],
        conditions=["memory", "in_segment"], sets=[],
    )  # fmt: skip
    runs = [
        {"scheme": scheme, "condition": condition, "seed": seed, "workdir": "runs/x",
         "curve": [{"distance": d, "byte_accuracy": a} for d, a in zip((8, 32), seeds, strict=True)]}
        for (scheme, condition), per_seed in accuracy.items()
        for seed, seeds in enumerate(per_seed)
    ]  # fmt: skip
    table = probes.render({"settings": settings, "chance": 0.1, "runs": runs})
    assert "`python -m experiments.probes --seeds 0,1`" in table
    assert "| distance | txl, memory | alibi, memory | alibi, in segment |" in table
    assert "| 8 | 1.000 ± 0.000 | 0.110 ± 0.014 | 0.400 ± 0.283 |" in table
    assert "| 32 | 0.800 ± 0.141 | 0.090 ± 0.014 | 0.100 ± 0.000 |" in table
    assert "- txl, memory: at 8, 32" in table  # 0.7 above chance, spreads 0 and 0.14
    assert "- alibi" not in table
    assert "scored with the memory runs'" not in table  # no in-segment run read through memory
    for run in runs:
        if run["condition"] == "in_segment":
            run["curve_with_memory"] = [{"distance": 8, "byte_accuracy": 0.9 + 0.01 * run["seed"]}]
    table = probes.render({"settings": settings, "chance": 0.1, "runs": runs})
    assert "| distance | alibi, in segment |\n|---:|---:|\n| 8 | 0.905 ± 0.007 |" in table
    assert "- alibi, in segment: at 8" in table


def test_the_library_comparison_is_rendered_from_its_json_with_memorys_effect():
    from experiments import compare_training

    def bpc(library, memory, seed):  # memory helps x-transformers beyond 2 sd, ours within
        gain = {"relpos_jax": 0.01, "x-transformers": 0.09}[library] if memory else 0.0
        return 2.0 - gain + 0.01 * seed

    runs = [
        {"scheme": "alibi", "library": library, "memory": memory, "seed": seed,
         "test_bpc": bpc(library, memory, seed)}
        for library in ("relpos_jax", "x-transformers") for memory in (64, 0) for seed in (0, 1)
    ]  # fmt: skip
    settings = sweep.settings(["experiments.compare_training"], steps=600, mem_len=64, seeds=[0, 1],
                              schemes=["alibi"], sets=["model.n_layers=4"])  # fmt: skip
    table = compare_training.render({"settings": settings, "runs": runs})
    assert "| alibi | relpos_jax | 64 | 1.9950 ± 0.0071 | -0.0100 |" in table
    assert "| alibi | x-transformers | 64 | 1.9150 ± 0.0071 | -0.0900 * |" in table
    assert "| alibi | x-transformers | 0 | 2.0050 ± 0.0071 |  |" in table


def test_the_library_comparison_lists_both_libraries_runs_as_command_lines():
    flags = ["--dry-run", "--schemes", "alibi", "--seeds", "0,1", "--steps", "5"]
    result = subprocess.run(
        [sys.executable, "-m", "experiments.compare_training", *flags, "--runs", "runs/cmp"],
        capture_output=True, text=True, timeout=120, check=True, cwd=ROOT,
    )  # fmt: skip
    lines = result.stdout.splitlines()
    assert len(lines) == 2 * 2 * 2  # libraries × memory × seeds
    assert all(line.startswith("python train.py") for line in lines[:4])
    assert shlex.split(lines[-1])[-2:] == ["--peer", "alibi:0:1"]


def test_a_runs_validation_curve_keeps_one_value_a_step(tmp_path):
    lines = [{"step": 5, "train/bpc": 3.0}, {"step": 10, "valid/bpc": 2.5},
             {"step": 20, "valid/bpc": 2.2}, {"step": 20, "valid/bpc": 2.1}]  # fmt: skip
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    assert sweep.validation_curve(tmp_path) == [(10, 2.5), (20, 2.1)]  # rerun: the last
    assert sweep.validation_curve(tmp_path / "missing") == []


def test_a_dry_run_lists_only_the_runs_not_finished(tmp_path, capsys):
    done, pending = (sweep.Run(n, tmp_path / n, "configs/txl_small.py", ()) for n in ("a", "b"))
    done.workdir.mkdir()
    finished = {"step": 7, "test": {"bpc": 2.0}, "data": {"name": "pystdlib", "partition": "dedup"}}
    (done.workdir / "eval.json").write_text(json.dumps(finished))
    options = argparse.Namespace(dry_run=True, finished_only=False, steps=7)
    assert sweep.finish({"a": done, "b": pending}, options) is None
    lines = [shlex.split(command) for command in capsys.readouterr().out.split(" && ")]
    assert [line[line.index("--workdir") + 1] for line in lines] == [str(pending.workdir)] * 2
    options.steps = 8  # a longer sweep: "a" trains on from its checkpoint
    sweep.finish({"a": done, "b": pending}, options)
    assert str(done.workdir) in capsys.readouterr().out
    options.steps = 7
    sweep.finish({"a": done}, options)
    assert capsys.readouterr().out == ""  # nothing left: not even an empty line for xargs


def test_finished_only_leaves_unfinished_runs_out_and_the_table_names_them(tmp_path):
    done, pending = (sweep.Run(n, tmp_path / n, "configs/txl_small.py", ()) for n in ("a", "b"))
    done.workdir.mkdir()
    finished = {"step": 7, "test": {"bpc": 2.0}, "data": {"name": "pystdlib", "partition": "dedup"}}
    (done.workdir / "eval.json").write_text(json.dumps(finished))
    options = argparse.Namespace(dry_run=False, finished_only=True, steps=7)
    runs, evaluated, missing = sweep.finish({"a": done, "b": pending}, options)
    assert list(runs) == ["a"] and list(evaluated) == ["a"] and missing == ["b"]
    results = _results()
    results["settings"]["missing"] = ["shaw_mem0_seed3"]
    assert "Not finished when this was written, so left out: shaw_mem0_seed3." in ablation.render(
        results
    )


def test_a_sweep_reuses_the_runs_its_json_holds_for_the_same_settings(tmp_path):
    results = _results()
    results["settings"].update(
        commit="abc1234", machine="AMD EPYC", date="2026-12-06", eval_every=0
    )
    sweep.write(tmp_path / "ablation.json", results)
    same = {"steps": 10, "mem_len": 64, "sets": [], "eval_every": 0}
    held = sweep.recorded(tmp_path / "ablation.json", ("scheme", "memory", "seed"), **same)
    assert len(held) == 12 and held["shaw", 0, 2]["test_bpc"] == 2.41
    where = [held["txl", 64, 0][field] for field in ("commit", "machine", "date")]
    assert where == ["abc1234", "AMD EPYC", "2026-12-06"]  # measured there, said so in the table
    assert not sweep.recorded(tmp_path / "ablation.json", ("scheme",), **{**same, "steps": 20})
    assert not sweep.recorded(tmp_path / "missing.json", ("scheme",), **same)
    (tmp_path / "old.json").write_text('{"txl/mem64": 2.27}')  # before settings were kept
    assert not sweep.recorded(tmp_path / "old.json", ("scheme",), **same)
    reused_before = {**results["runs"][3], "commit": "0123abc"}  # before machines were kept
    results["runs"] = [held["shaw", 0, 2], reused_before, *results["runs"][:3]]  # two reused
    sweep.write(tmp_path / "again.json", results)
    again = sweep.recorded(tmp_path / "again.json", ("scheme", "memory", "seed"), **same)
    assert again["txl", 0, 0] == reused_before  # not given the machine of abc1234's JSON
    results["settings"].update(commit="def5678", machine="Intel Xeon", date="2026-12-07")
    table = ablation.render(results)
    assert (
        "Reused from the JSON of commit abc1234 (AMD EPYC, 2026-12-06): shaw_mem0_seed2." in table
    )
    assert "Reused from the JSON of commit 0123abc: txl_mem0_seed0." in table
    assert "Reused" not in ablation.render(_results())


def test_the_probe_sweep_reuses_the_curves_its_json_holds_and_names_their_commit(tmp_path):
    from experiments import probes
    from relpos_jax.config import Config, load_config

    cfg = Config.from_any(load_config(ROOT / "configs/probe_needle.py", []))
    settings = sweep.settings(
        ["experiments.probes"], config="configs/probe_needle.py", kind="needle", steps=10,
        segment_len=16, mem_len=48, seeds=[0], schemes=["txl"], conditions=["memory"], sets=[],
    )  # fmt: skip
    settings.update(commit="abc1234", machine="AMD EPYC", date="2026-12-06")
    curve = [{"distance": d, "byte_accuracy": 0.5} for d in (8, 32)]
    earlier = {"scheme": "txl", "condition": "memory", "seed": 0, "workdir": "gone", "curve": curve}
    sweep.write(tmp_path / "probe_needle.json", {"settings": settings, "chance": 0.1,
                                                  "runs": [earlier]})  # fmt: skip
    args = argparse.Namespace(
        config="configs/probe_needle.py", schemes=["txl", "alibi"], conditions=["memory"],
        seeds=[0], steps=10, set=[], distances=[8, 32], runs=str(tmp_path / "runs"),
    )  # fmt: skip
    every = probes.runs_of(args, cfg)
    reused = probes._reused(tmp_path / "probe_needle.json", every, args, cfg)
    assert list(reused) == [("txl", "memory", 0)]  # alibi is not in the JSON: trained
    assert reused["txl", "memory", 0]["commit"] == "abc1234"
    for changed in ({"steps": 20}, {"distances": [8, 16]}, {"set": ["model.n_layers=1"]}):
        other = argparse.Namespace(**{**vars(args), **changed})
        assert not probes._reused(tmp_path / "probe_needle.json", every, other, cfg), changed
    finished = every["txl", "memory", 0].workdir  # a finished run folder here wins
    finished.mkdir(parents=True)
    (finished / "eval.json").write_text(json.dumps({"step": 10, "test": {"bpc": 2.0}}))
    assert not probes._reused(tmp_path / "probe_needle.json", every, args, cfg)
    table = probes.render({"settings": {**settings, "commit": "def5678"}, "chance": 0.1,
                           "runs": list(reused.values())})  # fmt: skip
    assert table.endswith(
        "\nReused from the JSON of commit abc1234 (AMD EPYC, 2026-12-06): txl, memory: seed 0.\n"
    )
    seeds = [reused["txl", "memory", 0], {**reused["txl", "memory", 0], "seed": 1}]
    table = probes.render({"settings": {**settings, "commit": "def5678"}, "chance": 0.1,
                           "runs": seeds})  # fmt: skip
    assert table.endswith("2026-12-06): txl, memory: seeds 0, 1.\n")  # a name once, its seeds
    assert "Reused" not in probes.render({"settings": settings, "chance": 0.1, "runs": [earlier]})


def test_a_run_measured_on_another_corpus_partition_is_not_reused(tmp_path):
    run = sweep.Run("a", tmp_path / "a", "configs/txl_small.py", ())
    run.workdir.mkdir()
    older = {"step": 7, "test": {"bpc": 2.0}}  # written before partitions: the hash one
    (run.workdir / "eval.json").write_text(json.dumps(older))
    assert run.result(7) is None
    hashed = sweep.Run("a", tmp_path / "a", "configs/txl_small.py", ("data.partition=hash",))
    assert hashed.result(7) == older
    settings = sweep.settings(["experiments.ablation", "--set", "data.partition=hash"])
    assert settings["partition"] == "hash" and sweep.settings(["x"])["partition"] == "dedup"
    results = {**_results(), "settings": {**_results()["settings"], "partition": "hash"}}
    sweep.write(tmp_path / "ablation.json", results)
    assert not sweep.recorded(tmp_path / "ablation.json", ("scheme",))  # this sweep: dedup


def test_a_run_measured_on_another_pythons_standard_library_is_not_reused(tmp_path, monkeypatch):
    from relpos_jax.data import corpora

    run = sweep.Run("a", tmp_path / "a", "configs/txl_small.py", ())
    run.workdir.mkdir()
    older = {"step": 7, "test": {"bpc": 2.0}, "data": {"name": "pystdlib", "partition": "dedup"}}
    (run.workdir / "eval.json").write_text(json.dumps(older))  # before the field: Python 3.11
    monkeypatch.setattr(corpora, "running_python", lambda: "3.11")
    assert run.result(7) == older
    results = _results()
    del results["settings"]["python"]  # a JSON from before the field, too
    sweep.write(tmp_path / "ablation.json", results)
    assert sweep.recorded(tmp_path / "ablation.json", ("scheme",))
    assert sweep.settings(["x"])["python"] == "3.11"
    assert sweep.partition_text(results["settings"]) == "pystdlib of Python 3.11, partition `dedup`"
    monkeypatch.setattr(corpora, "running_python", lambda: "3.12")  # a GPU machine's image
    assert run.result(7) is None and not sweep.recorded(tmp_path / "ablation.json", ("scheme",))
    pinned = sweep.Run("a", tmp_path / "a", "configs/txl_small.py", ("data.python=3.11",))
    assert pinned.result(7) == older  # the same corpus, read from where 3.11 prepared it
    monkeypatch.setattr(sys, "argv", ["ablation", "--set", "data.python=3.11"])
    assert sweep.recorded(tmp_path / "ablation.json", ("scheme",))
    assert sweep.settings(sys.argv)["python"] == "3.11"
