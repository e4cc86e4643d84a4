"""``experiments.recl``: its tables rendered from small JSONs (the group, the step, the scoring, the
intervals, init and best), its group and grid parsed, its dry run, and a killed sweep resumed."""

from __future__ import annotations

import json

import pytest

from experiments import sweep


def test_the_recl_table_is_rendered_from_its_json_with_spreads():
    from experiments import recl_tables

    runs = [
        {"label": f"txl, memory {m}", "scheme": "txl", "seed": seed,
         "bpc": {"0": 5.0, "64": 2.0 - 0.1 * (m > 0) + 0.01 * seed},
         "recl": {"0.1": 64 if m else 32, "0.5": 64, "1.0": 32},
         "pair_recl": {"0.1": 64, "0.5": 64 if seed else 32, "1.0": 32}}
        for m in (64, 0) for seed in (0, 1)
    ]  # fmt: skip
    settings = sweep.settings(["experiments.recl", "--seeds", "0,1"], tokens=1024, segment=16)
    table = recl_tables.render({"settings": settings, "contexts": [0, 64], "r": [0.1, 0.5, 1.0],
                                "runs": runs})  # fmt: skip
    assert "`python -m experiments.recl --seeds 0,1`" in table
    assert (
        "| txl, memory 64 | 2 | 5.0000 ± 0.0000 | 1.9050 ± 0.0071 | ≥64 ± 0 | ≥64 ± 0 | 32 ± 0 |"
        in table
    )
    assert (
        "| txl, memory 0 | 2 | 5.0000 ± 0.0000 | 2.0050 ± 0.0071 | 32 ± 0 | ≥64 ± 0 | 32 ± 0 |"
        in table
    )
    assert "| txl, memory 64 | ≥64 ± 0 | ≥48 ± 23 | 32 ± 0 |" in table  # its pair, as a group
    assert "**The earlier protocol**, not the paper's" in table  # a JSON without "protocol"


def _recl_row(label, scheme, mem_len, seed, recl_values, intervals):
    return {
        "label": label, "scheme": scheme, "seed": seed, "mem_len": mem_len,
        "scoring": "memory" if mem_len else "window",
        "bpc": {"0": 3.0, "32": 2.5 - 0.01 * seed, "64": 2.4},
        "recl": dict(zip(["0.1", "0.5", "1.0"], recl_values, strict=True)),
        "recl_interval": dict(zip(["0.1", "0.5", "1.0"], intervals, strict=True)),
    }  # fmt: skip


def _recl_results(seeds):
    runs = []
    for seed in seeds:
        runs += [
            _recl_row("txl, memory 64", "txl", 64, seed, [64, 32 + 32 * seed, 32],
                      [[32, 64], [32, 64], [0, 32]]),
            _recl_row("sinusoid, memory 0", "sinusoid", 0, seed, [0, 0, 0],
                      [[0, 32], [0, 0], [0, 0]]),
        ]  # fmt: skip
    settings = sweep.settings(["experiments.recl", "--ablation", "txl:M,sinusoid:0"], tokens=1024,
                              segment=16, group="txl:64,sinusoid:0")  # fmt: skip
    bootstrap = {"replicates": 500, "level": 0.95, "seed": 0, "block": 16}
    return {"settings": settings, "protocol": 2,
            "contexts": [0, 32, 64], "delta": 32, "r": [0.1, 0.5, 1.0], "bootstrap": bootstrap,
            "runs": runs}  # fmt: skip


def test_the_recl_table_says_the_group_the_step_the_scoring_and_the_intervals():
    from experiments import recl_tables

    table = recl_tables.render(_recl_results([0]))
    assert "`python -m experiments.recl --ablation txl:M,sinusoid:0`" in table
    assert "**The group**: txl, memory 64; sinusoid, memory 0. RECL is a property of a model " \
        "within its group" in table  # fmt: skip
    assert "c = 0, 32, 64 (Δ = 32)" in table
    assert "segments of s = 16" in table and "between c and c + 15 earlier tokens" in table
    assert (
        "95% percentile bootstrap over the scored tokens in blocks of 16, 500 replicates" in table
    )
    assert (
        "| txl, memory 64 | memory | 1 | ≥64 [32, ≥64] | 32 [32, ≥64] | 32 [0, 32] | "
        "Transformer-XL 128M: 700 / 600 / 500 |" in table
    )
    assert "| sinusoid, memory 0 | window | 1 | 0 [0, 32] | 0 [0, 0] | 0 [0, 0] | " \
        "vanilla Transformer: 128 |" in table  # fmt: skip
    assert "| 32 | 2.5000 | 2.5000 |" in table  # bpc by context
    assert "earlier protocol" not in table

    table = recl_tables.render(_recl_results([0, 1]))  # seeds: mean ± sd, then each seed's interval
    assert "| txl, memory 64 | memory | 2 | ≥64 ± 0 | ≥48 ± 23 | 32 ± 0 |" in table
    assert "| txl, memory 64 | 1 | ≥64 [32, ≥64] | ≥64 [32, ≥64] | 32 [0, 32] |" in table
    assert "| 32 | 2.4950 | 2.4950 |" in table
    # Table 6's init (the trained context: memory 64; 0 without) and best (the lowest mean bpc)
    assert "| txl, memory 64 | 64 | 2.4000 | 64 | 2.4000 |" in table
    assert "| sinusoid, memory 0 | 0 | 3.0000 | 64 | 2.4000 |" in table


def test_the_recl_group_defaults_to_the_papers_and_steps_by_a_fixed_delta(tmp_path):
    from experiments import recl

    assert recl.parse_group("paper", 64) == [("txl", 64), ("shaw", 64), ("txl", 0), ("sinusoid", 0)]
    assert recl.parse_group("rope,t5:M,txl:32", 64) == [
        ("rope", 64), ("rope", 0), ("t5", 64), ("txl", 32),
    ]  # fmt: skip
    for bad in ("nope:M", "txl:x", "txl,txl:0"):
        with pytest.raises(ValueError, match=r"experiments\.recl") as error:
            recl.parse_group(bad, 64)
        assert "\n" not in str(error.value)
    args = recl.parse(["--ablation", "--mem-len", "64", "--runs", str(tmp_path), "--seeds", "0,1"])
    assert args.contexts == list(range(0, 513, 32))
    assert args.bootstrap == {"replicates": 2000, "level": 0.95, "seed": 0, "block": 64}
    groups = recl.groups_of(args)
    assert list(groups) == [0, 1]
    assert [(m.label, m.mem_len, m.workdir.name) for m in groups[1]] == [
        ("txl, memory 64", 64, "txl_mem64_seed1"), ("shaw, memory 64", 64, "shaw_mem64_seed1"),
        ("txl, memory 0", 0, "txl_mem0_seed1"), ("sinusoid, memory 0", 0, "sinusoid_mem0_seed1"),
    ]  # fmt: skip
    assert groups[0][3].config.model.position == "sinusoid"
    assert groups[0][3].config.model.mem_len == 0
    with pytest.raises(SystemExit):
        recl.parse(["--ablation", "--delta", "48", "--longest", "512"])  # 512 is not 0 + k·48


def test_the_recl_dry_run_lists_the_groups_and_how_each_run_is_scored(tmp_path, capsys):
    from experiments import recl

    (tmp_path / "txl_mem64_seed0" / "checkpoints").mkdir(parents=True)
    recl.main(["--ablation", "--mem-len", "64", "--runs", str(tmp_path), "--dry-run",
               "--out", str(tmp_path / "out")])  # fmt: skip
    printed = capsys.readouterr().out
    assert "seed 0: to measure" in printed
    assert f"txl, memory 64: {tmp_path / 'txl_mem64_seed0'} (with memory c)\n" in printed
    assert (
        f"sinusoid, memory 0: {tmp_path / 'sinusoid_mem0_seed0'} (in windows of at most 128 "
        "(absolute positions)), not trained" in printed
    )  # txl_small's segment: an absolute-position model never sees a longer window
    assert f"txl, memory 0: {tmp_path / 'txl_mem0_seed0'} (in windows), not trained" in printed
    assert "python -m experiments.ablation --schemes shaw,txl,sinusoid --mem-len 64" in printed
    assert not (tmp_path / "out").exists()  # nothing measured, nothing written


def test_a_killed_recl_sweep_keeps_the_groups_it_measured_while_their_runs_are_unchanged(tmp_path):
    from experiments import recl

    group = [recl.Member(f"txl, memory {m}", "txl", m, None, tmp_path / f"txl_mem{m}")
             for m in (64, 0)]  # fmt: skip
    for *_, workdir in group:
        workdir.mkdir()
        (workdir / "eval.json").write_text(json.dumps({"step": 10, "test": {"bpc": 2.0}}))
    rows = [{"label": m.label, "seed": 0, "trained": recl.trained(m.workdir)} for m in group]
    now = {"settings": sweep.settings(["experiments.recl"], tokens=64, segment=4), "contexts": [0, 4],
           "r": [0.1, 0.5, 1.0], "protocol": recl.PROTOCOL,
           "bootstrap": {"replicates": 10, "level": 0.95, "seed": 0, "block": 4}}  # fmt: skip
    earlier = {**now, "runs": rows}
    assert recl.measured_before(earlier, now, 0, group) == rows
    assert recl.measured_before(earlier, now, 1, group) is None  # another seed's group
    assert recl.measured_before(None, now, 0, group) is None
    assert recl.measured_before({**earlier, "contexts": [0, 8]}, now, 0, group) is None
    assert recl.measured_before({**earlier, "protocol": None}, now, 0, group) is None  # earlier
    bootstrap = {**now["bootstrap"], "block": 1}
    assert recl.measured_before({**earlier, "bootstrap": bootstrap}, now, 0, group) is None
    other = {**now, "settings": {**now["settings"], "tokens": 128}}
    assert recl.measured_before(earlier, other, 0, group) is None
    assert recl.measured_before(earlier, now, 0, group[:1]) is None  # another group
    (group[1].workdir / "eval.json").write_text(json.dumps({"step": 10, "test": {"bpc": 2.5}}))
    assert recl.measured_before(earlier, now, 0, group) is None  # retrained: measured again
