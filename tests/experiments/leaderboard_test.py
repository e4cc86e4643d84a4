"""The leaderboard (``experiments.leaderboard``), rendered from small sweep JSONs without training."""

from __future__ import annotations

import json

from experiments import leaderboard


def _write(path, command: str, runs: list[dict], **settings) -> None:
    full = {"command": command, "commit": "abc1234", "date": "2026-12-03", **settings}
    path.write_text(json.dumps({"settings": full, "runs": runs}))


def _row(table: str, scheme: str, memory: str) -> list[str]:
    line = next(x for x in table.splitlines() if x.startswith(f"| {scheme} | {memory} |"))
    return [cell.strip() for cell in line.strip("|").split("|")][2:]


def test_the_leaderboard_gathers_every_sweep_with_spreads_and_says_what_is_missing(tmp_path):
    _write(tmp_path / "ablation.json", "python -m experiments.ablation", [
        {"scheme": "txl", "memory": m, "seed": s, "test_bpc": 2.0 + 0.1 * (m == 0) + 0.01 * s}
        for m in (64, 0) for s in range(3)
    ])  # fmt: skip
    _write(tmp_path / "extrapolation.json", "python -m experiments.extrapolation", [
        {"scheme": "t5", "variant": variant, "seed": s, "label": "t5",
         "bpc": {"non-overlapping": {"128": 2.0, "512": base + s * 0.02, "2048": base + 1}}}
        for variant, base in (("defaults", 3.0), ("sized", 2.5)) for s in range(2)
    ] + [
        {"scheme": "rope", "variant": "defaults", "seed": 0, "label": label,
         "bpc": {"non-overlapping": {"512": value}}}
        for label, value in (("rope", 4.0), ("rope+yarn", 2.2))
    ], train_len=128)  # fmt: skip
    old = {"settings": {"runs": "runs/recl"}, "bpc": {}}  # written before sweeps kept a command
    (tmp_path / "recl.json").write_text(json.dumps(old))
    _write(tmp_path / "probe_needle.json", "python -m experiments.probes", [
        {"scheme": "alibi", "condition": c, "seed": s,
         "curve": [{"distance": 8, "byte_accuracy": a}, {"distance": 32, "byte_accuracy": b}]}
        for c, a, b in (("memory", 0.3, 0.1), ("in_segment", 0.9, 0.96), ("no_memory", 0.0, 0.1))
        for s in range(2)
    ])  # fmt: skip
    table = leaderboard.render(*leaderboard.gather(tmp_path))
    assert _row(table, "txl", "yes")[0] == "2.0100 ± 0.0100 (3)"
    assert _row(table, "txl", "no")[0] == "2.1100 ± 0.0100 (3)"
    assert _row(table, "txl", "yes")[1:4] == ["—"] * 3  # extrapolation: trained without memory
    # the sized variant (tables within the trained distances) where the sweep has it
    assert _row(table, "t5", "no")[2:4] == ["2.5100 ± 0.0141 (2)", "3.5000 ± 0.0000 (2)"]
    assert _row(table, "rope", "no")[2] == "4.0000 ± 0.0000 (1)"  # not its extensions
    assert _row(table, "alibi", "yes")[6] == "0 of 2 [0.00, 0.84]"  # 0.2: not solved
    assert _row(table, "alibi", "no")[6] == "2 of 2 [0.16, 1.00]"  # in segment: 0.93
    assert _row(table, "txl", "yes")[4] == leaderboard.NOT_MEASURED  # recl.json: old format
    assert "| none |" not in table  # no sweep ran it: no row
    assert "- RECL: not measured (no `recl.json` with its settings yet)" in table
    source = "- test bpc: `python -m experiments.ablation` (commit abc1234, 2026-12-03, "
    assert source + "pystdlib of Python 3.11, partition `hash`)" in table  # before the fields
    assert "- needle solved: `python -m experiments.probes` (commit abc1234, 2026-12-03)" in table
    probe = json.loads((tmp_path / "probe_needle.json").read_text())
    probe["runs"][0]["commit"] = probe["runs"][1]["commit"] = "0123abc"  # reused from its JSON
    (tmp_path / "probe_needle.json").write_text(json.dumps(probe))
    table = leaderboard.render(*leaderboard.gather(tmp_path))
    needle = "- needle solved: `python -m experiments.probes` (commit abc1234, 2026-12-03; "
    assert needle + "runs reused from commit 0123abc)" in table
    full = leaderboard.render(*_full(tmp_path / "full"))
    assert _row(full, "learned", "no")[1:4] == [leaderboard.NOT_APPLICABLE] * 3  # clamped table
    assert leaderboard.NOT_MEASURED not in full
    assert _row(full, "txl", "yes")[4] == "≥128 (1)"  # the longest context: a lower bound
    assert _row(full, "txl", "no")[4] == "64 (1)"
    assert _row(full, "txl", "yes")[5] == "128 (1)" and _row(full, "txl", "no")[5] == "64 (1)"


def _full(folder, best_memory: int = 128):
    """Every cell measured: no "not measured" is left; the runs with memory best at
    ``best_memory``."""
    from relpos_jax.config import POSITIONS

    folder.mkdir()
    _write(folder / "ablation.json", "a", [
        {"scheme": p, "memory": m, "seed": 0, "test_bpc": 2.0} for p in POSITIONS for m in (64, 0)
    ])  # fmt: skip
    _write(folder / "extrapolation.json", "e", [
        {"scheme": p, "variant": "defaults", "seed": 0, "label": p,
         "bpc": {"non-overlapping": {"64": 2.0, "256": 2.0, "1024": 2.0}}} for p in POSITIONS
    ], train_len=64)  # fmt: skip
    _write(folder / "recl.json", "r", [
        {"scheme": p, "label": f"{p}, memory {m}", "seed": 0, "mem_len": m,
         "recl": {"0.1": 64 * (1 + (m > 0))}}
        for p in POSITIONS for m in (64, 0)
    ])  # fmt: skip
    results = json.loads((folder / "recl.json").read_text())
    (folder / "recl.json").write_text(json.dumps({**results, "contexts": [0, 64, 128]}))
    _write(folder / "init_best.json", "i", [
        {"scheme": p, "memory": m, "seed": 0, "best": best_memory if m else 64}
        for p in POSITIONS for m in (64, 0)
    ], contexts=[0, 64, 128, 256])  # fmt: skip
    _write(folder / "probe_needle.json", "n", [
        {"scheme": p, "condition": c, "seed": 0, "curve": [{"distance": 8, "byte_accuracy": 1.0}]}
        for p in POSITIONS for c in ("memory", "in_segment")
    ])  # fmt: skip
    return leaderboard.gather(folder)


def test_a_variant_of_a_scheme_has_a_row_only_where_it_was_measured(tmp_path):
    _write(tmp_path / "ablation.json", "a", [
        {"scheme": s, "memory": 0, "seed": 0, "test_bpc": b}
        for s, b in (("sinusoid", 2.2), ("sinusoid+half", 2.1))
    ])  # fmt: skip
    table = leaderboard.render(*leaderboard.gather(tmp_path))
    assert _row(table, "sinusoid+half", "no")[0] == "2.1000 ± 0.0000 (1)"
    assert "| sinusoid+half | yes |" not in table  # trained on half loss without memory only
    assert "| sinusoid | yes |" in table  # a scheme's rows: both, "not measured" where missing


def test_the_needle_column_counts_the_seeds_that_solve_it_at_the_trained_distances():
    curve = [{"distance": 8, "byte_accuracy": 1.0}, {"distance": 64, "byte_accuracy": 0.1}]
    run = {"scheme": "txl", "condition": "memory", "seed": 0, "curve": curve}
    cells: dict = {}
    leaderboard._needle({"settings": {"trained": [8, 48]}, "runs": [run]}, cells)
    assert cells == {("txl", True, leaderboard.NEEDLE): [1.0]}  # solved: 1.0 at 8
    cells = {}
    leaderboard._needle({"settings": {}, "runs": [run]}, cells)  # before the range was recorded
    assert cells == {("txl", True, leaderboard.NEEDLE): [0.0]}  # 0.55 over 8 and 64: not solved
    chance = {**run, "seed": 1, "curve": [{"distance": 8, "byte_accuracy": 0.1}]}
    probe = {"settings": {"trained": [8, 48]}, "runs": [run, chance]}
    cells = {}
    leaderboard._needle(probe, cells)
    key = ("txl", True, leaderboard.NEEDLE)
    assert leaderboard._cell(cells[key], key=key) == "1 of 2 [0.01, 0.99]"


def test_the_leaderboard_says_whether_its_columns_come_from_one_set_of_models():
    ablation = {
        "command": "python -m experiments.ablation",
        "steps": 4000,
        "sets": ["model.n_layers=4"],
    }
    own = {
        "command": "python -m experiments.extrapolation",
        "steps": 500,
        "sets": [],
        "models": "own",
    }
    shared = {**own, "models": "ablation", "steps": 4000, "sets": ["model.n_layers=4"]}
    recl = {"command": "python -m experiments.recl --ablation txl --runs runs/ablation"}
    one = leaderboard._one_set({"ablation.json": ablation, "extrapolation.json": shared,
                                "recl.json": recl})  # fmt: skip
    assert one.startswith("Test bpc, extrapolation and RECL come from one set of models")
    apart = leaderboard._one_set({"ablation.json": ablation, "extrapolation.json": own})
    assert apart.startswith("Not one set of models: bpc at 1×, 4× and 16× (models of its own)")
    init_best = {
        "command": "python -m experiments.init_best",
        "steps": 4000,
        "sets": ["model.n_layers=4"],
    }
    four = leaderboard._one_set({"ablation.json": ablation, "extrapolation.json": shared,
                                 "recl.json": recl, "init_best.json": init_best})  # fmt: skip
    assert four.startswith("Test bpc, extrapolation, RECL and best context come from one set")
    other = leaderboard._one_set(
        {"ablation.json": ablation, "init_best.json": {**init_best, "steps": 500}}
    )
    assert other.startswith("Not one set of models: best context come")


def test_the_context_columns_give_each_seeds_context_where_they_differ(tmp_path):
    _write(tmp_path / "init_best.json", "i", [
        {"scheme": "shaw", "memory": 64, "seed": s, "best": best}
        for s, best in enumerate((64, 256, 64))
    ] + [{"scheme": "shaw", "memory": 0, "seed": s, "best": 0} for s in range(3)],
        contexts=[0, 64, 128, 256])  # fmt: skip
    table = leaderboard.render(*leaderboard.gather(tmp_path))
    assert _row(table, "shaw", "yes")[5] == "64, ≥256, 64 (3)"  # not a mean no run chose: 128
    assert _row(table, "shaw", "no")[5] == "0 (3)"
