"""Tables with bootstrap intervals (``experiments.compare.Compare``): the ablation and the leaderboard
rendered from synthetic runs that kept their test windows — ``mean [lo, hi]`` and "lower than" only
where a paired interval excludes zero — and from runs without them, which keep ``mean ± sd`` and the
spread rule; the windows' way from a run's folder to a sweep's JSON and back."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from experiments import ablation, compare, leaderboard, sweep
from relpos_jax import eval_results

T, W = 8, 200  # tokens a window, windows
LAYOUT = f"segments of {T}, 4 rows, {T * W} targets"
OFFSET = {("txl", 64): 0.0, ("txl", 0): 0.1, ("shaw", 64): 0.3, ("shaw", 0): 0.305}


def _windows(bpc: np.ndarray, layout: str = LAYOUT) -> dict:
    return {"bits": bpc * T, "tokens": np.full(len(bpc), T), "layout": layout}


def _results() -> dict:
    """Three seeds of txl and shaw, with memory and without, on one test text of ``W`` windows:
    memory lowers txl's bpc by 0.1 on every window; shaw's 0.005 is within its seeds' 0.02."""
    hard = np.random.default_rng(0).gamma(4.0, 0.5, W)
    rng = np.random.default_rng(1)
    settings = sweep.settings(["experiments.ablation", "--seeds", "0,1,2"], steps=10, mem_len=64,
                              seeds=[0, 1, 2], schemes=["txl", "shaw"], sets=[])  # fmt: skip
    runs = []
    for (scheme, memory), offset in OFFSET.items():
        for seed in range(3):
            bpc = hard + offset + 0.02 * (seed - 1) + rng.normal(0, 0.01, W)
            runs.append({"scheme": scheme, "memory": memory, "seed": seed, "workdir": "runs/x",
                         "test_bpc": float(bpc.mean()), "test_windows": _windows(bpc)})  # fmt: skip
    return {"settings": settings, "runs": runs}


def _row(table: str, start: str) -> str:
    return next(line for line in table.splitlines() if line.startswith(start))


INTERVAL = r"\d\.\d{4} \[\d\.\d{4}, \d\.\d{4}\]"


def test_the_ablation_gives_intervals_and_paired_differences_where_runs_kept_windows():
    results = _results()
    table = ablation.render(results)
    assert re.fullmatch(rf"\| txl \| 64 \| {INTERVAL} \| 3 \| 27\.02 \|", _row(table, "| txl | 64"))
    assert "mean ± sample sd" not in table and " ± " not in table
    assert f"then the {W} windows ({LAYOUT}), resampled 2,000 times]" in table
    heading = (
        "Differences whose 95% bootstrap interval, paired on the windows, excludes zero (lower"
    )
    assert heading in table
    found = re.search(
        r"- txl: memory lowers test bpc by 0\.(\d+) \(difference (-0\.\d+) \[(.*)\]\)", table
    )
    lo, hi = map(float, found[3].split(", "))
    assert found[1].startswith("09") and lo < float(found[2]) < hi < 0  # 0.1 a window, then noise
    assert "- shaw: memory" not in table  # 0.005 apart, seeds 0.02 apart
    assert "- txl (memory 0) lower than shaw (memory 64), next in the ranking (difference" in table
    assert "- txl (memory 64) lower than txl (memory 0)" in table
    assert "- shaw (memory 64) lower" not in table
    # each cell's point is its seeds' mean bpc; its interval holds it
    compare = ablation._compare(results)
    assert compare.bootstrap
    mean = np.mean([r["test_bpc"] for r in results["runs"] if r["scheme"] == "txl" and r["memory"]])
    assert compare.mean(("txl", 64)) == pytest.approx(mean, rel=1e-12)
    assert compare.interval(("txl", 64)).contains(mean)
    assert table == ablation.render(results)  # seeded: the same table every time


@pytest.mark.parametrize("how", ["one run without", "another split's windows"])
def test_the_ablation_falls_back_to_the_spread_rule_and_says_so(how):
    results = _results()
    if how == "one run without":  # an eval.json from before windows were kept
        results["runs"][4]["test_windows"] = None
    else:
        results["runs"][4]["test_windows"] = _windows(np.ones(W), "segments of 8, 2 rows")
    table = ablation.render(results)
    assert not ablation._compare(results).bootstrap
    assert re.fullmatch(r"\| txl \| 64 \| \d\.\d{4} ± \d\.\d{4} \| 3 \| 27\.02 \|",
                        _row(table, "| txl | 64"))  # fmt: skip
    assert "mean ± sample sd over the seeds." in table
    assert "Differences beyond twice the larger spread (lower bpc is better):" in table
    assert "(difference" not in table


def test_one_seed_a_group_the_bootstrap_finds_what_the_spread_rule_cannot():
    hard = np.random.default_rng(0).gamma(4.0, 0.5, W)
    values = {"a": [float(hard.mean())], "b": [float(hard.mean()) + 0.01]}
    windows = {"a": [_windows(hard)], "b": [_windows(hard + 0.01)]}
    with_windows, without = compare.Compare(values, windows), compare.Compare(values)
    assert with_windows.bootstrap and not without.bootstrap
    assert with_windows.apart("a", "b") and with_windows.in_ranking(["a", "b"]) == [("a", "b")]
    assert not without.apart("a", "b")  # one seed: never apart by the spread
    same = compare.Compare(
        {"a": values["a"], "c": values["a"]}, {"a": windows["a"], "c": windows["a"]}
    )
    assert not same.apart("a", "c") and same.difference_text("a", "c", 3).startswith(
        " (difference +0.000 [+0.000, +0.000])"
    )


def test_windows_go_beside_the_sweeps_json_and_come_back(tmp_path):
    results = _results()
    sweep.write(tmp_path / "ablation.json", results)
    written = json.loads((tmp_path / "ablation.json").read_text())
    assert written["runs"][0]["test_windows"] == {
        "file": "ablation_windows.npz", "key": "0.test_windows", "count": W, "layout": LAYOUT,
    }  # fmt: skip
    assert (tmp_path / "ablation_windows.npz").exists()
    assert results["runs"][0]["test_windows"]["bits"].shape == (W,)  # the caller's left whole
    back = sweep.load(tmp_path / "ablation.json")
    np.testing.assert_array_equal(
        back["runs"][5]["test_windows"]["bits"], results["runs"][5]["test_windows"]["bits"]
    )
    assert ablation.render(back) == ablation.render(results)
    # the JSON alone (its windows' file not beside it): the spread rule
    assert "± " in ablation.render(written)
    (tmp_path / "ablation_windows.npz").unlink()
    assert "± " in ablation.render(sweep.load(tmp_path / "ablation.json"))
    # a sweep without windows: its JSON as before, no file beside it
    plain = {"settings": results["settings"], "runs": [{"scheme": "txl", "test_bpc": 2.0}]}
    sweep.write(tmp_path / "plain.json", plain)
    assert json.loads((tmp_path / "plain.json").read_text()) == plain
    assert not (tmp_path / "plain_windows.npz").exists()


def test_a_runs_windows_are_read_from_its_folder_in_blocks(tmp_path):
    bits, tokens = np.arange(10.0) + 1.0, np.full(10, 4)
    windows = {"bits": bits, "tokens": tokens, "layout": "segments of 4, 1 rows, 40 targets"}
    eval_results.save_results(tmp_path, {"step": 3, "test": {"bpc": 1.0, "windows": windows}})
    whole = compare.windows_of(tmp_path, "test")
    np.testing.assert_array_equal(whole["bits"], bits)
    assert whole["layout"] == windows["layout"]
    blocks = compare.windows_of(tmp_path, "test", at_most=4)  # blocks of 3: 3 + 3 + 3 + 1 windows
    assert blocks["bits"].tolist() == [6.0, 15.0, 24.0, 10.0]
    assert blocks["tokens"].tolist() == [12, 12, 12, 4]
    assert blocks["layout"] == "segments of 4, 1 rows, 40 targets, blocks of 3"
    assert compare.windows_of(tmp_path, "valid") is None
    (tmp_path / "eval.json").write_text(json.dumps({"step": 3, "test": {"bpc": 1.0}}))
    assert compare.windows_of(tmp_path, "test") is None  # an eval.json from before


def test_the_leaderboard_gives_intervals_where_the_ablation_kept_windows(tmp_path):
    sweep.write(tmp_path / "ablation.json", _results())
    table = leaderboard.render(*leaderboard.gather(tmp_path))
    txl = _row(table, "| txl | yes |").split("|")[3].strip()
    assert re.fullmatch(rf"{INTERVAL} \(3\)", txl)
    assert "The test bpc column reads the mean over the seeds [its 95% bootstrap interval" in table
    (tmp_path / "ablation_windows.npz").unlink()  # the JSON alone: mean ± sd, as before
    table = leaderboard.render(*leaderboard.gather(tmp_path))
    assert re.fullmatch(
        r"\d\.\d{4} ± \d\.\d{4} \(3\)", _row(table, "| txl | yes |").split("|")[3].strip()
    )
    assert "bootstrap" not in table
