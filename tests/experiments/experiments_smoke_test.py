"""The research sweeps stay runnable: each runs once at toy sizes (``python -m experiments.<name>``)
and prints its table, and the committed tables, leaderboards and papers of docs/results/ are the
ones their JSONs render. Those marked ``bench`` (minutes of compiling in the fresh processes the
sweeps start) run with ``make test-bench``, not in ``make test``; the benchmarks' are
tests/bench/bench_smoke_test.py."""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys

import pytest

from experiments import (
    ablation,
    extrapolation,
    extrapolation_tables,
    latter_half_scoring,
    probe_solved,
    probes,
    recl_tables,
    sweep,
)
from tests.helpers import ROOT


def experiment(name: str, *flags: str) -> list[str]:
    """The command line of ``python -m experiments.<name> flags...``, run with ``cwd=ROOT``."""
    return [sys.executable, "-m", f"experiments.{name}", *flags]


@pytest.mark.bench
def test_bench_ablation_then_extrapolation_run(tiny, tmp_path, monkeypatch):
    config, _ = tiny
    sets = [
        "model.n_layers=1", "model.d_model=32", "model.n_heads=2", "model.d_ff=64",
        "data.name=text", f"data.path={config.data.path}", f"data.dir={config.data.dir}",
        "data.segment_len=8", "data.batch_size=4",
    ]  # fmt: skip
    command = experiment(
        "ablation", "--steps", "2", "--schemes", "rope", "--seeds", "0", "--half-loss", "rope",
        "--runs", str(tmp_path / "runs"),
        "--out", str(tmp_path / "out"), *(f"--set={s}" for s in sets),
    )  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith("| rope")]
    assert len(rows) == 5 and (tmp_path / "out" / "ablation.png").stat().st_size > 0
    results = sweep.load(tmp_path / "out" / "ablation.json")  # its windows read back beside it
    assert [(r["scheme"], r["memory"]) for r in results["runs"]] == [
        ("rope", 128),
        ("rope", 0),
        ("rope+half", 0),
    ]
    table = (tmp_path / "out" / "ablation.md").read_text()
    assert table == ablation.render(results)
    windows = results["runs"][0]["test_windows"]  # eval.py's, as the sweep keeps them
    assert windows["tokens"].sum() == round(windows["bits"].sum() / results["runs"][0]["test_bpc"])
    assert "bootstrap interval" in table
    # without memory, each run's test split again on offsets 4-7 of its segments of 8, kept in it
    assert results["runs"][0]["latter_half_windows"] is None
    for run in results["runs"][1:]:
        latter = run["latter_half_windows"]
        assert latter["layout"].endswith("targets from offset 4")
        assert 0.4 < latter["tokens"].sum() / windows["tokens"].sum() < 0.6
        assert (pathlib.Path(run["workdir"]) / "latter_half.npz").is_file()
    assert "[" in table.split("latter half of each segment |")[1]  # intervals, not ± sd
    half = results["runs"][2]  # rope+half: no later sweep reads it
    kept = sweep.Run("rope_half_mem0_seed0", pathlib.Path(half["workdir"]), "-", ())
    monkeypatch.setattr(latter_half_scoring, "_measure", lambda run: pytest.fail("scored again"))
    again = latter_half_scoring.windows(kept)  # kept for this training: read back, not scored
    assert again["layout"] == half["latter_half_windows"]["layout"]
    (kept.workdir / "eval.json").write_text(json.dumps({"step": 3, "test": {"bpc": 1.0}}))
    with pytest.raises(pytest.fail.Exception, match="scored again"):  # trained again: scored again
        latter_half_scoring.windows(kept)

    command = experiment(
        "extrapolation", "--schemes", "rope,t5", "--seeds", "0", "--steps", "2",
        "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out"), "--train-len", "8",
        "--tokens", "40", "--stride", "3", "--tiled-from", "16", "--sliding-up-to", "8",
        "--pi-steps", "2", *(f"--set={s}" for s in sets),
    )  # fmt: skip
    for factors in ("1,2", "1,2,4"):  # the second run scores only the new length
        result = subprocess.run(
            [*command, "--factors", factors], capture_output=True, text=True, timeout=600, cwd=ROOT
        )
        assert result.returncode == 0, result.stderr[-3000:]
    measured = [line for line in result.stdout.splitlines() if line.startswith("  ")]
    scored = {line.split(": ")[0].split()[-1] for line in measured}
    assert scored == {"L=32"}
    partial = subprocess.run(  # tabulates what is scored, scores nothing: L = 64 still to come
        [*command, "--factors", "1,2,4,8", "--scored-only", "--out", str(tmp_path / "partial")],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert partial.returncode == 0, partial.stderr[-3000:]
    assert not [line for line in partial.stdout.splitlines() if line.startswith("  ")]
    assert "| rope | " in partial.stdout and partial.stdout.count(" – |") >= 8  # L=64, every row
    assert "still to be scored" in partial.stdout
    results = sweep.read(tmp_path / "out" / "extrapolation.json")  # with its windows
    labels = {(r["label"], r["variant"]) for r in results["runs"]}
    assert labels == {("rope", "defaults"), ("t5", "defaults"), ("t5", "sized")} | {
        (f"rope+{kind}", "defaults")
        for kind in (*extrapolation.ROPE_EXTENSIONS, "linear, fine-tuned")
    } | {(extrapolation.past_label("linear"), "defaults")}  # the 2× fine-tune scored at 4×
    lengths = {
        (r["label"], r["seed"], *(tuple(sorted(v)) for v in r["bpc"].values()))
        for r in results["runs"]
        if "fine-tuned" not in r["label"]
    }
    assert {n[2:] for n in lengths} == {(("16", "32", "8"), ("8",))}
    fine_tuned = [r["bpc"] for r in results["runs"] if r["label"] == extrapolation.PI_LABEL]
    assert [set(b["non-overlapping"]) for b in fine_tuned] == [{"16"}, {"32"}]  # 2×, then 4×
    past = [r["bpc"] for r in results["runs"] if r["label"] == extrapolation.past_label("linear")]
    assert [set(b["non-overlapping"]) for b in past] == [{"32"}]  # the 2× fine-tune at 4×
    assert (tmp_path / "runs" / "rope_pi4_len8_seed0" / "eval.json").exists()
    kept = results["runs"][0]["bpc_windows"]["non-overlapping"]["32"]  # each cell's windows
    assert kept["tokens"].sum() == 40 and "segments of 32" in kept["layout"]
    table = (tmp_path / "out" / "extrapolation.md").read_text()
    assert table == extrapolation_tables.render(results) and "| rope | " in table
    assert re.search(r"\| rope \| \d\.\d{3} \[", table)  # one seed: an interval over windows
    assert (tmp_path / "out" / "extrapolation.png").stat().st_size > 0

    command = experiment(
        "recl", "--ablation", "rope", "--runs", str(tmp_path / "runs"), "--seeds", "0",
        "--out", str(tmp_path / "out"), "--delta", "4", "--longest", "8", "--tokens", "64",
        "--segment", "4", "--replicates", "50", *(f"--set={s}" for s in sets),
    )  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((tmp_path / "out" / "recl.json").read_text())
    assert [r["label"] for r in results["runs"]] == ["rope, memory 128", "rope, memory 0"]
    assert [(r["mem_len"], r["scoring"]) for r in results["runs"]] == [
        (128, "memory"),
        (0, "window"),
    ]
    assert results["contexts"] == [0, 4, 8] and results["settings"]["group"] == "rope:128,rope:0"
    assert all(set(r["recl"]) == set(r["recl_interval"]) == {"0.1", "0.5", "1.0"}
               for r in results["runs"])  # fmt: skip
    assert (tmp_path / "out" / "recl.md").read_text() == recl_tables.render(results)
    again = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "seed 0: the group's RECL is in" in again.stdout  # resumed, not measured again
    assert json.loads((tmp_path / "out" / "recl.json").read_text())["runs"] == results["runs"]


@pytest.mark.bench
def test_bench_probes_runs_every_scheme(tiny, tmp_path):
    config, _ = tiny
    sets = [
        "model.n_layers=1", "model.d_model=32", "model.n_heads=2", "model.d_ff=64",
        "data.batch_size=4", f"data.dir={config.data.dir}",
    ]  # fmt: skip
    command = experiment(
        "probes", "--steps", "2", "--schemes", "rope", "--seeds", "0", "--distances", "8,32",
        "--conditions", "memory,in_segment",
        "--runs", str(tmp_path / "runs"), "--out", str(tmp_path / "out"),
        *(f"--set={s}" for s in sets),
    )  # fmt: skip
    (tmp_path / "out").mkdir()
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((tmp_path / "out" / "probe_needle.json").read_text())
    assert [(r["scheme"], r["condition"]) for r in results["runs"]] == [
        ("rope", "memory"),
        ("rope", "in_segment"),
    ]
    assert all([c["distance"] for c in r["curve"]] == [8, 32] for r in results["runs"])
    memory, in_segment = results["runs"]  # in segment: only where the key is inside it
    assert not any(c["reachable_only"] for c in memory["curve"])
    assert all(c["reachable_only"] for c in in_segment["curve"])
    assert memory["curve"][0]["reachable"] == 1.0 and 0 < in_segment["curve"][1]["reachable"] < 1
    assert [(c["segment_len"], c["mem_len"]) for c in in_segment["curve_with_memory"]] == [
        (16, 48)
    ] * 2
    assert (tmp_path / "out" / "probe_needle.png").stat().st_size > 0
    assert (tmp_path / "out" / "probe_needle.md").read_text() == probes.render(results)


def test_extrapolation_sizes_only_the_tables_that_sizing_changes():
    assert extrapolation.sized_as_defaults("t5", 128)  # max distance 128, 32 buckets: its defaults
    assert not extrapolation.sized_as_defaults("t5", 64)
    assert not any(extrapolation.sized_as_defaults(s, 128) for s in ("shaw", "deberta"))


def test_extrapolation_table_names_a_repeated_variant_and_leaves_out_empty_protocols(tmp_path):
    settings = {
        "command": "python -m experiments.extrapolation", "commit": "abc", "machine": "m", "date": "d",
        "train_len": 128, "steps": 5, "seeds": [0], "lengths": [256], "tokens": 512,
        "stride": None, "sliding_up_to": 128, "sized_as_defaults": ["t5"], "scored_only": True,
    }  # fmt: skip
    runs = [{"scheme": "alibi", "variant": "defaults", "seed": 0, "label": "alibi",
             "bpc": {"non-overlapping": {"256": 2.7}, "sliding": {}}}]  # fmt: skip
    table = extrapolation_tables.render({"settings": settings, "runs": runs})
    assert "| alibi | 2.700" in table and "**sliding**" not in table
    assert "No sized row for t5" in table
    assert "still to be scored" not in table  # --scored-only, but every cell holds every seed
    extrapolation_tables.plot({"settings": settings, "runs": runs}, tmp_path / "one_length.png")
    assert (tmp_path / "one_length.png").stat().st_size > 0  # one panel: no protocol has a line


def test_extrapolation_table_says_what_holds_beyond_twice_the_spread():
    settings = {
        "command": "c", "commit": "abc", "machine": "m", "date": "d", "train_len": 128,
        "steps": 5, "seeds": [0, 1, 2], "lengths": [128, 512, 2048], "tokens": 512,
        "stride": None, "sliding_up_to": 128, "scored_only": True,
    }  # fmt: skip
    scores = {  # label: {L: per-seed bpc}; "partial" has one seed at 2048
        "rises": {"128": [2.50, 2.51, 2.49], "512": [3.00, 3.01, 2.99], "2048": [3.5, 3.5, 3.6]},
        "flat": {"128": [2.5, 2.6, 2.4], "512": [2.55, 2.65, 2.45], "2048": [2.5, 2.7, 2.6]},
        "partial": {"128": [2.0, 2.0, 2.01], "512": [2.0, 2.01, 2.0], "2048": [2.0]},
    }
    runs = [
        {"scheme": label, "variant": "defaults", "seed": seed, "label": label,
         "bpc": {"non-overlapping": {n: v[seed] for n, v in by.items() if seed < len(v)}}}
        for label, by in scores.items() for seed in range(3)
    ]  # fmt: skip
    table = extrapolation_tables.render({"settings": settings, "runs": runs})
    along, every, some = table.split("Each row from its trained length")[1].split("The ranking at")
    along = along.splitlines()
    assert "- rises: rises from 2.500 at L=128 to 3.533 at L=2048" in along
    assert "- flat: L=128 to L=2048 not apart" in along
    assert "- partial: L=128 to L=512 not apart" in along  # the longest with every seed
    every = every.splitlines()  # every row, at the longest they all have; no windows: the spread
    assert every[0] == " L=512, neighbours beyond twice the larger spread (non-overlapping):"
    assert "- partial lower than flat, next in the ranking" in every
    assert "- flat lower than rises, next in the ranking" in every
    some = some.splitlines()  # and at the longest that two rows have, "partial" left out
    assert some[0] == (" L=2048 (2 of 3 rows: those with every seed there), neighbours beyond "
                       "twice the larger spread (non-overlapping):")  # fmt: skip
    assert "- flat lower than rises, next in the ranking" in some
    assert not any("partial" in line for line in some)
    assert "(1 of 3 seeds)" in table and "still to be scored" in table
    assert "| rises | 2.500 ± 0.010 |" in table


@pytest.mark.parametrize(
    "table, script",
    [("results/ablation", "experiments.ablation"), ("results/recl", "experiments.recl_tables"),
     ("results/init_best", "experiments.init_best"),
     ("results/extrapolation", "experiments.extrapolation_tables"),
     ("results/extrapolation_32k/extrapolation", "experiments.extrapolation_tables"),
     ("results/extrapolation_32k_whole/extrapolation", "experiments.extrapolation_tables"),
     ("results/probe_needle", "experiments.probes"),
     ("results/probe_needle_rerun/probe_needle", "experiments.probes"),
     ("results/txl_small", "experiments.txl_small"),
     ("results/earlier/ablation", "experiments.ablation"),
     ("results/earlier/memory_growth/ablation", "experiments.ablation"),
     ("results/earlier/recl", "experiments.recl_tables"),
     ("results/earlier/compare_training", "experiments.compare_training"),
     ("results/earlier/extrapolation", "experiments.extrapolation_tables"),
     ("results/earlier/compare_training_init05/compare_training", "experiments.compare_training"),
     ("results/earlier/probe_needle", "experiments.probes"),
     ("benchmarks/compile_depth", "bench.compile_depth")],
)  # fmt: skip
def test_the_committed_sweep_tables_are_rendered_from_their_json(table, script):
    import importlib

    render = importlib.import_module(script).render
    results = sweep.read(ROOT / f"docs/{table}.json")  # with its windows, where kept
    assert render(results) == (ROOT / f"docs/{table}.md").read_text()


@pytest.mark.parametrize("folder", ["docs/results", "docs/results/earlier"])
def test_the_committed_leaderboard_and_papers_are_gathered_from_the_committed_jsons(folder):
    from experiments import leaderboard, papers

    rendered = leaderboard.render(*leaderboard.gather(ROOT / folder))
    assert rendered == (ROOT / folder / "README.md").read_text()
    assert papers.render(papers.gather(ROOT / folder)) == (ROOT / folder / "papers.md").read_text()


def test_the_probe_table_leads_with_the_seeds_that_solve_it_at_trained_distances():
    assert probes.trained_distances("probe:needle:8-48") == [8, 16, 24, 32, 40, 48]
    assert probes.trained_distances("probe:passkey:100") == [100]
    per_seed = {  # (scheme, condition) -> each seed's accuracy at 8, 48 (trained) and 64 (not)
        ("txl", "memory"): [(1.0, 0.95, 0.1), (1.0, 0.7, 0.1), (0.92, 0.9, 1.0)],
        ("alibi", "memory"): [(0.1, 0.1, 1.0), (0.12, 0.08, 1.0), (0.1, 0.1, 1.0)],
    }
    settings = {
        "command": "python -m experiments.probes", "commit": "abc", "machine": "m", "date": "d",
        "config": "configs/probe_needle.py", "kind": "needle", "steps": 10, "segment_len": 16,
        "mem_len": 48, "seeds": [0, 1, 2], "trained": [8, 48],
    }  # fmt: skip
    runs = [
        {"scheme": scheme, "condition": condition, "seed": seed,
         "curve": [{"distance": d, "byte_accuracy": a} for d, a in zip((8, 48, 64), accuracy,
                                                                        strict=True)]}
        for (scheme, condition), seeds in per_seed.items()
        for seed, accuracy in enumerate(seeds)
    ]  # fmt: skip
    results = {"settings": settings, "chance": 0.1, "runs": runs}
    assert probe_solved.solved_by(results) == {
        ("txl", "memory"): (2, 3), ("alibi", "memory"): (0, 3)
    }  # fmt: skip
    table = probes.render(results)
    assert "| scheme | memory |\n|---|---:|\n| txl | 2 of 3 [0.09, 0.99] |" in table
    assert "| alibi | 0 of 3 [0.00, 0.71] |" in table
    assert "| 64* |" in table and "| 48 |" in table  # the untrained distance is marked
    assert "outside the trained range 8–48" in table


def test_extrapolation_from_the_ablation_scores_the_ablations_own_runs_without_memory():
    import argparse

    sets = ["model.n_layers=4", "data.segment_len=64"]
    args = argparse.Namespace(
        schemes=["txl", "rope"], seeds=[0, 1], runs="runs/ablation", steps=1000, set=sets,
        models="ablation", pi_steps=0, variants=["defaults"],
    )  # fmt: skip
    runs = extrapolation.runs_of(args)
    same = argparse.Namespace(
        schemes=["txl", "rope"], seeds=[0, 1], runs="runs/ablation", steps=1000, set=sets,
        mem_len=64, eval_every=0,
    )  # fmt: skip
    trained = {key: run for key, run in ablation.runs_of(same).items() if key[1] == 0}
    assert sorted(runs) == sorted((s, "defaults", seed) for s, _, seed in trained)
    for (scheme, _, seed), run in trained.items():
        assert runs[scheme, "defaults", seed].commands() == run.commands()


def test_each_extension_is_fine_tuned_from_each_seeds_rope_run_with_its_own_scaling():
    import argparse

    from relpos_jax.config import load_config

    args = argparse.Namespace(
        schemes=["rope"], seeds=[0], runs="runs/x", steps=1000, set=["data.segment_len=64"],
        models="ablation", pi_steps=100, variants=["defaults"], factors=[1, 2, 4, 8],
        extensions_up_to=4, fine_tune=("linear", "yarn"), train_len=64,
    )  # fmt: skip
    fine_tunes = extrapolation.fine_tune_runs_of(args, extrapolation.runs_of(args))
    assert {key: run.name for key, run in fine_tunes.items()} == {
        ("linear", 2, 0): "rope_pi2_len64_seed0", ("linear", 4, 0): "rope_pi4_len64_seed0",
        ("yarn", 2, 0): "rope_yarn2_len64_seed0", ("yarn", 4, 0): "rope_yarn4_len64_seed0",
    }  # fmt: skip
    yarn = fine_tunes["yarn", 4, 0]
    config = load_config(ROOT / yarn.config, list(yarn.settings))
    assert dict(config.model.rope_scaling) == {
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64,
        "beta_fast": 0.5, "beta_slow": 1 / 64,
    }  # fmt: skip
    assert config.data.segment_len == 256 and "train.init_from=runs/x/rope_mem0_seed0" in str(
        yarn.settings
    )
    assert extrapolation.fine_tuned_rows("yarn", 2, args) == [
        ("rope+yarn, fine-tuned", [128]), ("rope+yarn, fine-tuned, at 2× its length", [256])
    ]  # fmt: skip
    assert extrapolation.fine_tuned_rows("yarn", 8, args) == [("rope+yarn, fine-tuned", [512])]


def test_the_core_comparison_lists_every_training_run_once_from_one_command(tmp_path):
    result = subprocess.run(  # an empty --out: no run reused from the JSONs of docs/results
        [sys.executable, "-m", "experiments.core", "--dry-run", "--seeds", "0", "--probe-seeds", "0",
         "--runs", "runs/x", "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert len(lines) == len(set(lines)) and all(
        line.startswith("python train.py") for line in lines
    )
    workdirs = [line.split("--workdir ")[1].split()[0] for line in lines]
    assert "runs/x/txl_mem64_seed0" in workdirs and "runs/x/txl_mem0_seed0" in workdirs
    for fine_tune in ("rope_pi2_len64_seed0", "rope_ntk2_len64_seed0", "rope_yarn8_len64_seed0"):
        assert workdirs.index("runs/x/rope_mem0_seed0") < workdirs.index(f"runs/x/{fine_tune}")
    assert any(w.startswith("runs/x/probes/probe_needle_txl_memory") for w in workdirs)
    assert all("--config.train.steps=4000" in line for line in lines if "probe" not in line
               and "_pi" not in line)  # fmt: skip


def test_the_core_comparison_reuses_the_runs_its_committed_json_holds(tmp_path):
    committed = json.loads((ROOT / "docs/results/ablation.json").read_text())
    dropped = ("shaw", 64, 0)  # as if never measured: the one run of the JSON to train again
    committed["runs"] = [
        row for row in committed["runs"] if (row["scheme"], row["memory"], row["seed"]) != dropped
    ]
    (tmp_path / "ablation.json").write_text(json.dumps(committed))
    result = subprocess.run(
        [sys.executable, "-m", "experiments.core", "--dry-run", "--seeds", "0", "--runs", "runs/x",
         "--out", str(tmp_path)],
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    workdirs = {line.split("--workdir ")[1].split()[0] for line in result.stdout.splitlines()}
    assert "runs/x/shaw_mem64_seed0" in workdirs  # dropped from the JSON: trained
    assert "runs/x/txl_mem64_seed0" not in workdirs  # measured there: reused, not listed
