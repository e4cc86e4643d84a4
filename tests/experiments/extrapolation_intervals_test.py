"""The extrapolation sweep with bootstrap intervals: a run's cells keep their evaluation windows in
its folder (a cell scored before windows were kept is scored again), the sweep's JSON carries them
nested by protocol and length, and the table, the leaderboard's columns and the papers' claims at
one length use the paired bootstrap where every seed kept them (``experiments.compare``)."""

from __future__ import annotations

import json
import math
import re
import types

import numpy as np
import pytest

from experiments import (
    compare,
    extrapolation_scoring,
    extrapolation_tables,
    leaderboard,
    papers,
    sweep,
)
from relpos_jax.analysis import bootstrap
from tests.helpers import evaluation_stopped_before_call

T, W = 8, 200  # tokens a window, windows
INTERVAL = r"\d\.\d{3} \[\d\.\d{3}, \d\.\d{3}\]"


def _windows(bpc: np.ndarray, length: int) -> dict:
    return {"bits": bpc * T, "tokens": np.full(len(bpc), T),
            "layout": f"segments of {length}, 4 rows, {T * W} targets"}  # fmt: skip


def _results(offsets: dict[str, float], lengths=(8, 32), seeds: int = 1) -> dict:
    """Each label's runs (``seeds``) at ``lengths`` on one text of ``W`` windows: the same hard
    windows, ``offsets[label]`` higher on every one, 0.3 higher at the longer length."""
    hard = np.random.default_rng(0).gamma(4.0, 0.5, W)
    noise = np.random.default_rng(1)
    settings = {
        "command": "python -m experiments.extrapolation", "commit": "abc", "machine": "m",
        "date": "d", "train_len": 8, "steps": 5, "seeds": list(range(seeds)),
        "lengths": list(lengths), "tokens": T * W, "stride": None, "sliding_up_to": 0,
    }  # fmt: skip
    runs = []
    for label, offset in offsets.items():
        for seed in range(seeds):
            by_length = {
                str(n): hard + offset + 0.3 * (n > lengths[0]) + noise.normal(0, 0.01, W)
                for n in lengths
            }
            runs.append({
                "scheme": label.split("+")[0], "variant": "defaults", "seed": seed, "label": label,
                "bpc": {"non-overlapping": {n: float(b.mean()) for n, b in by_length.items()}},
                "bpc_windows": {"non-overlapping": {
                    n: _windows(b, int(n)) for n, b in by_length.items()
                }},
            })  # fmt: skip
    return {"settings": settings, "runs": runs}


def _row(table: str, start: str) -> list[str]:
    line = next(line for line in table.splitlines() if line.startswith(start))
    return [cell.strip() for cell in line.split("|")[2:-1]]


def test_the_table_gives_intervals_and_paired_rankings_where_every_seed_kept_windows():
    results = _results({"alibi": 0.0, "t5": 0.01})  # one seed each: the spread rule says nothing
    table = extrapolation_tables.render(results)
    assert all(re.fullmatch(INTERVAL, cell) for cell in _row(table, "| alibi |"))
    ranking = table.split("The ranking at L=32, neighbours whose 95% bootstrap interval, paired on "
                          "the windows, excludes zero (non-overlapping):")[1]  # fmt: skip
    found = re.search(
        r"- alibi lower than t5, next in the ranking \(difference (.*) \[(.*)\]\)", ranking
    )
    lo, hi = map(float, found[2].split(", "))
    assert lo < -0.01 < hi < 0  # 0.01 lower on every window, and noise
    assert table == extrapolation_tables.render(results)  # seeded: the same table every time
    # from the trained length to the longest: the same tokens at both, paired (one seed each)
    rise = re.search(
        r"- alibi: rises from .* at L=8 to .* at L=32 \(difference \+0\.30\d \[", table
    )
    assert rise and "paired on the windows, excludes zero; non-overlapping" in table

    results["runs"][1]["bpc_windows"] = {}  # t5's run scored before windows were kept
    table = extrapolation_tables.render(results)
    assert re.fullmatch(r"\d\.\d{3} ± 0\.000", _row(table, "| t5 |")[0])
    assert re.fullmatch(INTERVAL, _row(table, "| alibi |")[0])  # each cell by its own seeds
    ranking = table.split("The ranking at L=32, neighbours beyond twice the larger spread")[1]
    assert "lower than" not in ranking


def test_a_table_of_the_whole_split_says_how_many_windows_its_longest_length_has():
    results = _results({"alibi": 0.0})
    results["settings"]["tokens"] = 0  # the whole split
    cells = results["runs"][0]["bpc_windows"]["non-overlapping"]
    cells["32"] = _regrouped(cells["32"], 4)  # W / 4 windows of 32 tokens
    said = f"on every test token ({T * W:,} targets, {W // 4} windows at L = 32)"
    assert said in extrapolation_tables.render(results)
    cells["32"] = compare.in_blocks(cells["32"], 10)  # as a sweep's JSON may keep them: in blocks
    assert said in extrapolation_tables.render(results)
    results["runs"][0]["bpc_windows"] = {}  # none kept: the count is not known
    assert "on every test token. Sized" in extrapolation_tables.render(results)


def test_nested_windows_go_beside_the_sweeps_json_and_come_back(tmp_path):
    results = _results({"alibi": 0.0, "t5": 0.01})
    sweep.write(tmp_path / "extrapolation.json", results)
    written = json.loads((tmp_path / "extrapolation.json").read_text())
    assert written["runs"][1]["bpc_windows"]["non-overlapping"]["32"] == {
        "file": "extrapolation_windows.npz", "key": "1.bpc_windows.non-overlapping.32",
        "count": W, "layout": f"segments of 32, 4 rows, {T * W} targets",
    }  # fmt: skip
    back = sweep.read(tmp_path / "extrapolation.json")
    np.testing.assert_array_equal(
        back["runs"][1]["bpc_windows"]["non-overlapping"]["32"]["bits"],
        results["runs"][1]["bpc_windows"]["non-overlapping"]["32"]["bits"],
    )
    assert extrapolation_tables.render(back) == extrapolation_tables.render(results)
    (tmp_path / "extrapolation_windows.npz").unlink()  # the JSON alone: mean ± sd
    assert "± " in extrapolation_tables.render(sweep.read(tmp_path / "extrapolation.json"))


def test_the_leaderboards_extrapolation_columns_give_intervals_where_runs_kept_windows(tmp_path):
    results = _results({"alibi": 0.0, "t5": 0.01}, lengths=(8, 32, 128), seeds=2)
    sweep.write(
        tmp_path / "extrapolation.json",
        {
            **results,
            "settings": {
                **results["settings"],
                "command": "python -m experiments.extrapolation --seeds 0,1",
            },
        },
    )
    table = leaderboard.render(*leaderboard.gather(tmp_path))
    cells = _row(table, "| alibi | no |")[2:5]  # bpc at 1×, 4×, 16×
    assert all(re.fullmatch(r"\d\.\d{4} \[\d\.\d{4}, \d\.\d{4}\] \(2\)", c) for c in cells), cells
    assert "The bpc at 4× column reads the mean over the seeds [its 95% bootstrap interval" in table
    (tmp_path / "extrapolation_windows.npz").unlink()
    table = leaderboard.render(*leaderboard.gather(tmp_path))
    assert re.fullmatch(r"\d\.\d{4} ± \d\.\d{4} \(2\)", _row(table, "| alibi | no |")[2])


def test_a_claim_at_one_length_is_judged_by_the_paired_bootstrap_where_windows_were_kept():
    yarn, ntk = papers.fine_tuned_label("yarn"), papers.fine_tuned_label("ntk")
    results = _results({yarn: 0.0, ntk: 0.01}, lengths=(8, 16))  # 2× the trained 8
    claim = "fine-tuned at 2× the trained length, YaRN below NTK-aware at that length"
    judged = {c.claim: v for c, v in papers.judge_all({"extrapolation.json": results},
                                                      lambda *_: True)}  # fmt: skip
    assert judged[claim].verdict == "agrees" and "(difference -0.0" in judged[claim].ours
    for run in results["runs"]:
        run["bpc_windows"] = {}
    judged = {c.claim: v for c, v in papers.judge_all({"extrapolation.json": results},
                                                      lambda *_: True)}  # fmt: skip
    assert judged[claim].verdict == "not resolved" and judged[claim].why.startswith("one seed")


def _args(**changes) -> types.SimpleNamespace:
    return types.SimpleNamespace(**{
        "tokens": 96, "stride": None, "train_len": 8, "extensions_up_to": 8,
        "sliding_up_to": 8, "scored_only": False, "tiled_from": 1024, "batch_tokens": 32,
        **changes,
    })  # fmt: skip


def _trained(tiny, position: str, monkeypatch) -> None:
    """A fresh tiny ``position`` model (memory 0) stands for a run's checkpoint, step 10."""
    from flax import nnx

    from relpos_jax import evaluate
    from relpos_jax.config import Config
    from relpos_jax.model import TransformerLM

    config, _ = tiny
    config = config.copy_and_resolve_references()
    config.model.update(position=position, mem_len=0)
    cfg = Config.from_any(config)
    model = TransformerLM(cfg.model, rngs=nnx.Rngs(0))
    monkeypatch.setattr(evaluate, "restore_model", lambda *_: (model, cfg, 10))
    monkeypatch.setattr(extrapolation_scoring, "load_config", lambda *_: config)


def test_a_runs_cells_keep_their_windows_and_older_cells_are_scored_again(
    tiny, tmp_path, monkeypatch, capsys
):
    _trained(tiny, "rope", monkeypatch)
    run = sweep.Run("rope_mem0_seed0", tmp_path, "configs/rope_small.py", ())
    labels = (("rope", None), ("rope+ntk", "ntk"))

    def scored(**changes):
        found = extrapolation_scoring.score(run, labels, [8, 16], _args(**changes))
        return found, [line for line in capsys.readouterr().out.splitlines() if "L=" in line]

    first, lines = scored()
    assert len(lines) == 3  # rope at 8 and 16, rope+ntk at 16 (at 8 it is rope: copied)
    rope = first["rope"]
    for protocol, by_length in rope.windows.items():
        for n, w in by_length.items():  # each cell's windows are its bpc's
            assert w["bits"].sum() / w["tokens"].sum() == pytest.approx(rope.bpc[protocol][n])
    assert first["rope+ntk"].bpc["sliding"]["8"] == rope.bpc["sliding"]["8"]
    assert set(first["rope+ntk"].windows["non-overlapping"]) == {"8", "16"}
    cache, windows_file = extrapolation_scoring.cache_files(tmp_path, _key())
    assert windows_file.is_file()

    again, lines = scored()  # everything kept: nothing scored
    assert not lines and again["rope"].bpc == rope.bpc
    np.testing.assert_array_equal(
        again["rope"].windows["non-overlapping"]["16"]["bits"],
        rope.windows["non-overlapping"]["16"]["bits"],
    )

    older = json.loads(cache.read_text())  # as written before windows were kept
    cache.write_text(json.dumps({"key": older["key"], "bpc": older["bpc"]}))
    tabulated, lines = scored(scored_only=True)  # tabulates the bpc, scores nothing
    assert not lines and tabulated["rope"].bpc == rope.bpc
    assert not tabulated["rope"].windows["non-overlapping"]
    rescored, lines = scored()
    assert len(lines) == 3 and rescored["rope"].bpc == rope.bpc  # the same model, the same bpc
    assert set(rescored["rope"].windows["non-overlapping"]) == {"8", "16"}
    assert set(rescored["rope"].windows["sliding"]) == {"8"}  # sliding only up to 8

    whole, lines = scored(tokens=0)  # other settings: scored in files of their own
    assert len(lines) == 3 and whole["rope"].bpc != rope.bpc
    segments = whole["rope"].windows["non-overlapping"]
    assert segments["8"]["tokens"].sum() % 16  # the split is no whole number of 16-token windows,
    short, long = bootstrap.on_shared_blocks(  # yet the two lengths' segments nest
        *(bootstrap.Scores.of([segments[n]]) for n in ("8", "16"))
    )
    assert short.windows == long.windows == np.count_nonzero(segments["16"]["tokens"])
    kept, lines = scored(scored_only=True)  # the first settings' cells are still there
    assert not lines and kept["rope"].bpc == rope.bpc
    assert set(kept["rope"].windows["sliding"]) == {"8"}


def test_a_cell_stopped_while_scored_goes_on_from_its_kept_blocks(tiny, tmp_path, monkeypatch):
    from relpos_jax import eval_progress, evaluate

    _trained(tiny, "alibi", monkeypatch)
    monkeypatch.setattr(evaluate, "SEGMENTS_PER_CALL", 1)  # 96 tokens in rows of 4: 3 blocks at 8
    monkeypatch.setattr(eval_progress.PassProgress, "due", lambda self: True)
    labels, args = (("alibi", None),), _args(sliding_up_to=16)

    def scored(folder):
        folder.mkdir(exist_ok=True)  # the run's folder, where it trained
        run = sweep.Run("alibi_mem0_seed0", folder, "configs/alibi_small.py", ())
        return extrapolation_scoring.score(run, labels, [8, 16], args)["alibi"]

    once = scored(tmp_path / "once")
    with evaluation_stopped_before_call(monkeypatch, 1):
        scored(tmp_path / "stopped")
    (kept,) = (tmp_path / "stopped").glob("extrapolation_pass_*.npz")
    with np.load(kept) as arrays:
        cell = json.loads(str(arrays["key"]))
        assert int(arrays["blocks"]) == 1
    assert (cell["row"], cell["length"], cell["protocol"]) == ("alibi", "8", "non-overlapping")
    again = scored(tmp_path / "stopped")
    assert again.bpc == once.bpc  # every cell, bit for bit
    for protocol, by_length in once.windows.items():
        for n, w in by_length.items():
            np.testing.assert_array_equal(again.windows[protocol][n]["bits"], w["bits"])
    assert not list((tmp_path / "stopped").glob("extrapolation_pass_*"))


def _key(**changes) -> dict:
    return extrapolation_scoring.scoring_key(_args(**changes))


def test_a_runs_cells_written_before_the_files_were_per_key_are_read_where_their_key_is_the_same(
    tmp_path,
):
    legacy = tmp_path / extrapolation_scoring.LEGACY_CACHE
    bpc = {"rope": {"non-overlapping": {"8": 1.5}, "sliding": {}}}
    legacy.write_text(json.dumps({"key": _key(), "bpc": bpc}))
    assert extrapolation_scoring._Cells(tmp_path, _key()).bpc == bpc
    assert extrapolation_scoring._Cells(tmp_path, _key(tokens=0)).bpc == {}
    cells = extrapolation_scoring._Cells(tmp_path, _key())
    cells.put("rope", "sliding", "8", 1.25, None)
    cells.save()  # into the key's own files; the legacy file stays as it was
    assert json.loads(legacy.read_text())["bpc"] == bpc
    assert extrapolation_scoring._Cells(tmp_path, _key()).bpc["rope"]["sliding"] == {"8": 1.25}


def test_segment_cells_scored_off_the_grid_are_scored_again(tmp_path):
    """Segments in rows of ceil(N / B) tokens, as scored before rows were whole segments: they end
    mid-grid and nest in no longer length's windows, so ``score`` measures them again; sliding
    windows and segments on the grid are kept."""
    cells = extrapolation_scoring._Cells(tmp_path, _key())
    rows_of_21 = {"bits": np.ones(6), "tokens": np.array([8, 8, 5, 8, 8, 5]), "layout": "rows"}
    on_grid = {"bits": np.ones(6), "tokens": np.array([8, 8, 8, 8, 8, 2]), "layout": "rows"}
    cells.put("rope", "non-overlapping", "8", 1.0, rows_of_21)
    cells.put("rope", "sliding", "8", 1.0, rows_of_21)
    cells.put("rope", "non-overlapping", "16", 1.0, {**on_grid, "tokens": on_grid["tokens"] * 2})
    assert not cells.has("rope", "non-overlapping", "8", windows=True)
    assert cells.has("rope", "non-overlapping", "8", windows=False)  # its bpc is still tabulated
    assert cells.has("rope", "sliding", "8", windows=True)
    assert cells.has("rope", "non-overlapping", "16", windows=True)


def _regrouped(windows: dict, size: int) -> dict:
    """``windows`` summed ``size`` at a time (the last group shorter): other windows of the same
    tokens."""
    return compare.in_blocks(windows, math.ceil(len(windows["tokens"]) / size))


def test_a_sweeps_blocks_of_segments_stay_nested_in_the_longer_lengths_windows():
    """The sweep's JSON sums a length's windows into at most a few hundred blocks: a power of two
    of them each, so that 8-token segments in blocks still end where 32-token windows do (blocks of
    3 would share an end with them every 96 tokens)."""
    results = _results({"alibi": 0.0})
    cells = results["runs"][0]["bpc_windows"]["non-overlapping"]
    long = bootstrap.Scores.of([_regrouped(cells["32"], 4)])  # W / 4 windows of 4T
    for nested, shared in ((False, W // 12 + 1), (True, W // 4)):  # every 12th T, and the last
        short = bootstrap.Scores.of([compare.in_blocks(cells["8"], 70, nested=nested)])
        assert short.windows <= 70
        assert bootstrap.on_shared_blocks(short, long)[0].windows == shared


def test_two_lengths_pair_only_where_their_windows_nest():
    results = _results({"alibi": 0.0})  # one seed
    cells = results["runs"][0]["bpc_windows"]["non-overlapping"]
    cells["32"] = _regrouped(cells["32"], 3)  # windows of 3T: every end one of the 8-token windows'
    table = extrapolation_tables.render(results)
    assert re.search(
        r"- alibi: rises from .* at L=8 to .* at L=32 \(difference \+0\.30\d \[", table
    )

    cells["8"] = _regrouped(cells["8"], 2)  # windows of 2T against 3T: every sixth T's end shared,
    table = extrapolation_tables.render(results)  # fewer blocks than either has: not paired
    assert ("- alibi: L=8 to L=32 not compared (one seed, and the two lengths' windows are not "
            "paired: not kept, or not nested)") in table  # fmt: skip
    assert "**sliding**" not in table  # sliding_up_to 0: no sliding windows scored, no table
