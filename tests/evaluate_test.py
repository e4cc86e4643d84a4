"""``evaluate`` scores blocks of segments in one call each (``score_segments``): the same numbers as
scoring one segment at a time, whatever the block size; its windows (each row of each segment, or
each sliding window) fall alike for every model, and go beside ``eval.json`` (``eval_results``)."""

import json

import numpy as np
import optax
import pytest

from relpos_jax import eval_results
from relpos_jax import evaluate as evaluate_lib
from relpos_jax.analysis import bootstrap
from relpos_jax.analysis.bootstrap import Scores
from relpos_jax.data import pipeline
from tests.helpers import tiny_model

TOKENS = np.random.default_rng(7).integers(0, 256, 1000)


def _one_segment_at_a_time(model, batch_size, segment_len, mem_len, tokens=TOKENS, scored_from=0):
    """The reference: the model called segment by segment with the memory of hidden states, the
    losses summed in float64 on the host, in all, at each position of the segment and in each row of
    each segment (the windows, row by row: the text's order; the padding's left out), of the targets
    at offset ``scored_from`` or later in their segment."""
    stream = pipeline.ArrayStream(tokens)
    total, count, mems = 0.0, 0.0, None
    at_position, at_position_count = np.zeros(segment_len), np.zeros(segment_len)
    window_loss, window_count = [], []
    for batch in pipeline.eval_batches(stream, batch_size, segment_len):
        batch["weights"] = batch["weights"] * (np.arange(segment_len) >= scored_from)
        if mems is None:
            mems = model.init_mems(batch["inputs"].shape[0], mem_len)
        logits, mems = model(batch["inputs"], mems)
        losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"])
        weighted = np.asarray(losses, np.float64) * batch["weights"]
        total += float(np.sum(weighted))
        count += float(batch["weights"].sum())
        at_position += weighted.sum(0)
        at_position_count += batch["weights"].sum(0)
        window_loss.append(weighted.sum(1))
        window_count.append(batch["weights"].sum(1))
    window_loss, window_count = np.array(window_loss).T.ravel(), np.array(window_count).T.ravel()
    scored = window_count > 0
    windows = window_loss[scored] * evaluate_lib.BITS_PER_NAT, window_count[scored]
    return total / count, count, at_position / at_position_count, windows


@pytest.mark.parametrize("position", ["txl", "rope"])
def test_blocks_of_segments_score_like_one_segment_at_a_time(monkeypatch, position):
    model = tiny_model(position, mem_len=24)
    # 3 rows of 333 targets: 21 segments of 16
    loss, count, by_position, (window_bits, window_tokens) = _one_segment_at_a_time(
        model, 3, 16, 24
    )
    assert count == 999 and len(window_tokens) == 3 * 21  # rows of 20 segments of 16 and one of 13
    # 4: five blocks and one filled up (or, filling nothing, one shorter); 64: one block of 21
    for per_call, fill in ((1, 0), (4, evaluate_lib.FILL_AT_MOST), (4, 0), (21, 0), (64, 0)):
        monkeypatch.setattr(evaluate_lib, "SEGMENTS_PER_CALL", per_call)
        monkeypatch.setattr(evaluate_lib, "FILL_AT_MOST", fill)
        result = evaluate_lib.evaluate(
            model, pipeline.ArrayStream(TOKENS), batch_size=3, segment_len=16, mem_len=24
        )
        assert result["tokens"] == 999, per_call
        np.testing.assert_allclose(result["loss"], loss, rtol=2e-6, err_msg=f"{per_call} a call")
        bits = by_position * evaluate_lib.BITS_PER_NAT
        np.testing.assert_allclose(result["bpc_by_position"], bits, rtol=2e-5, atol=1e-5)
        windows = result["windows"]
        assert windows["layout"] == "segments of 16, 3 rows, 999 targets"
        np.testing.assert_array_equal(windows["tokens"], window_tokens)
        np.testing.assert_allclose(windows["bits"], window_bits, rtol=2e-5, atol=1e-5)
        # the totals are the windows' sums: a bootstrap's point estimate is the reported bpc
        point = Scores(windows["bits"], windows["tokens"]).point
        assert point == pytest.approx(result["bpc"], rel=1e-14)


def test_long_segments_are_scored_fewer_a_call_to_the_same_result(monkeypatch):
    assert evaluate_lib.segments_per_call(16 * 64) == 16  # short segments: SEGMENTS_PER_CALL
    assert evaluate_lib.segments_per_call(8192) == 8
    assert evaluate_lib.segments_per_call(2 * 32768) == evaluate_lib.segments_per_call(1 << 20) == 1
    model = tiny_model("txl", mem_len=24)
    score = lambda: evaluate_lib.evaluate(  # noqa: E731  3 rows of 333: 21 segments of 16
        model, pipeline.ArrayStream(TOKENS), batch_size=3, segment_len=16, mem_len=24
    )
    sixteen = score()
    calls, counted = [], evaluate_lib.score_segments
    monkeypatch.setattr(evaluate_lib, "score_segments", lambda *a: calls.append(1) or counted(*a))
    monkeypatch.setattr(evaluate_lib, "TOKENS_PER_CALL", 4 * 3 * 16)  # 4 segments of 3 × 16
    fewer = score()
    assert len(calls) == 6  # 21 segments, 4 a call
    np.testing.assert_allclose(fewer["loss"], sixteen["loss"], rtol=1e-6)
    np.testing.assert_array_equal(fewer["windows"]["tokens"], sixteen["windows"]["tokens"])


def test_blocks_are_stacked_and_the_last_filled_with_zero_weight_segments():
    batches = [
        {"inputs": np.full((2, 3), k + 1), "weights": np.ones((2, 3), np.float32)} for k in range(5)
    ]
    blocks = list(evaluate_lib._blocks(batches, 2))
    assert [b["inputs"].shape for b in blocks] == [(2, 2, 3)] * 3
    np.testing.assert_array_equal([b["inputs"][:, 0, 0] for b in blocks], [[1, 2], [3, 4], [5, 0]])
    assert [float(b["weights"].sum()) for b in blocks] == [12.0, 12.0, 6.0]
    # fewer batches than a block: one block of them all, nothing added
    (only,) = evaluate_lib._blocks(batches[:3], 16)
    assert only["inputs"].shape == (3, 2, 3)
    assert list(evaluate_lib._blocks([], 4)) == []


def test_a_last_block_whose_filling_would_score_many_tokens_is_shorter_instead(monkeypatch):
    batches = [{"inputs": np.full((2, 3), k + 1), "weights": np.ones((2, 3))} for k in range(5)]
    monkeypatch.setattr(evaluate_lib, "FILL_AT_MOST", 17)  # 3 segments of 2 × 3 would be 18
    blocks = list(evaluate_lib._blocks(batches, 4))
    assert [b["inputs"].shape for b in blocks] == [(4, 2, 3), (1, 2, 3)]
    np.testing.assert_array_equal(blocks[1]["inputs"][:, 0, 0], [5])
    monkeypatch.setattr(evaluate_lib, "FILL_AT_MOST", 18)
    assert [b["inputs"].shape for b in evaluate_lib._blocks(batches, 4)] == [(4, 2, 3)] * 2


def test_models_scored_alike_have_the_same_windows_and_can_be_paired():
    """With memory and without, other parameters: the same windows, in the same order."""
    stream = pipeline.ArrayStream(TOKENS[:301])
    kw = dict(batch_size=4, segment_len=16)
    a = evaluate_lib.evaluate(tiny_model("txl", mem_len=24), stream, mem_len=24, **kw)
    b = evaluate_lib.evaluate(tiny_model("txl", seed=1, mem_len=0), stream, mem_len=0, **kw)
    assert a["windows"]["layout"] == b["windows"]["layout"] == "segments of 16, 4 rows, 300 targets"
    np.testing.assert_array_equal(a["windows"]["tokens"], b["windows"]["tokens"])
    assert a["windows"]["tokens"].tolist() == ([16] * 4 + [11]) * 4  # 75 targets a row
    assert not np.allclose(a["windows"]["bits"], b["windows"]["bits"])
    found = bootstrap.difference(Scores.of([a["windows"]]), Scores.of([b["windows"]]))
    assert found.point == pytest.approx(a["bpc"] - b["bpc"], abs=1e-12)


def test_scored_from_an_offset_scores_the_latter_part_of_each_segment_as_the_reference_does():
    model, tokens = tiny_model("sinusoid", mem_len=0), TOKENS[:301]
    latter = evaluate_lib.evaluate(
        model, pipeline.ArrayStream(tokens), batch_size=4, segment_len=16, mem_len=0, scored_from=8
    )
    loss, count, _, (bits, window_tokens) = _one_segment_at_a_time(
        model, 4, 16, 0, tokens=tokens, scored_from=8
    )
    assert latter["windows"]["layout"] == "segments of 16, 4 rows, 140 targets from offset 8"
    # rows of 75 targets: segments of 16, 16, 16, 16 and 11, each scored from its offset 8 on
    assert count == latter["tokens"] == 140
    assert latter["windows"]["tokens"].tolist() == window_tokens.tolist() == [8, 8, 8, 8, 3] * 4
    np.testing.assert_allclose(latter["windows"]["bits"], bits, rtol=2e-5, atol=1e-5)
    np.testing.assert_allclose(latter["loss"], loss, rtol=2e-6)
    with pytest.raises(ValueError, match="scored_from=16 is invalid"):
        evaluate_lib.evaluate(
            model, pipeline.ArrayStream(tokens), batch_size=4, segment_len=16, mem_len=0,
            scored_from=16,
        )  # fmt: skip


def test_sliding_windows_are_the_windows_in_order_whatever_the_batch():
    model = tiny_model("alibi", mem_len=0)
    stream = pipeline.ArrayStream(TOKENS[:100])  # 99 targets: windows of 16, stride 5
    one = evaluate_lib.evaluate_sliding(model, stream, batch_size=1, window=16, stride=5)
    four = evaluate_lib.evaluate_sliding(model, stream, batch_size=4, window=16, stride=5)
    assert one["windows"]["tokens"].tolist() == [16] + [5] * 16 + [3]
    assert four["windows"]["layout"] == "sliding windows of 16, stride 5, 99 targets"
    np.testing.assert_array_equal(four["windows"]["tokens"], one["windows"]["tokens"])
    np.testing.assert_allclose(four["windows"]["bits"], one["windows"]["bits"], rtol=1e-5)
    point = Scores.of([four["windows"]]).point
    assert point == pytest.approx(four["bpc"], rel=1e-14)


def test_windows_are_saved_beside_a_small_eval_json_and_read_back(tmp_path):
    bits, tokens = np.array([10.5, 3.25, 7.0]), np.array([8, 2, 5])
    results = {
        "settings": {"segment_len": 8},
        "test": {"bpc": 1.5, "tokens": 15,
                 "windows": {"bits": bits, "tokens": tokens, "layout": "segments of 8"}},
        "step": 4,
    }  # fmt: skip
    eval_results.save_results(tmp_path, results)
    written = json.loads((tmp_path / "eval.json").read_text())
    assert written["test"]["windows"] == {
        "file": "eval_windows.npz",
        "count": 3,
        "layout": "segments of 8",
    }
    assert written["step"] == 4 and written["test"]["bpc"] == 1.5
    assert results["test"]["windows"]["bits"] is bits  # the caller's results are left as they were
    back = eval_results.load_windows(tmp_path, "test")
    np.testing.assert_array_equal(back["bits"], bits)
    np.testing.assert_array_equal(back["tokens"], tokens)
    assert back["layout"] == "segments of 8" and back["bits"].dtype == np.float64
    assert eval_results.load_windows(tmp_path, "valid") is None  # not evaluated
    assert not list(tmp_path.glob("*.partial"))
    # an eval.json from before windows were kept, or without its file: no windows, no error
    (tmp_path / "eval_windows.npz").unlink()
    assert eval_results.load_windows(tmp_path, "test") is None
    (tmp_path / "eval.json").write_text(json.dumps({"step": 4, "test": {"bpc": 1.5}}))
    assert eval_results.load_windows(tmp_path, "test") is None
    assert eval_results.load_windows(tmp_path / "nothing", "test") is None
