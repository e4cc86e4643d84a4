"""``evaluate`` scores blocks of segments in one call each (``score_segments``): the same numbers as
scoring one segment at a time, whatever the block size."""

import numpy as np
import optax
import pytest

from relpos_jax import evaluate as evaluate_lib
from relpos_jax.data import pipeline
from tests.helpers import tiny_model

TOKENS = np.random.default_rng(7).integers(0, 256, 1000)


def _one_segment_at_a_time(model, batch_size, segment_len, mem_len):
    """The reference: the model called segment by segment with the memory of hidden states, the
    losses summed in float64 on the host, in all and at each position of the segment."""
    stream = pipeline.ArrayStream(TOKENS)
    total, count, mems = 0.0, 0.0, None
    at_position, at_position_count = np.zeros(segment_len), np.zeros(segment_len)
    for batch in pipeline.eval_batches(stream, batch_size, segment_len):
        if mems is None:
            mems = model.init_mems(batch["inputs"].shape[0], mem_len)
        logits, mems = model(batch["inputs"], mems)
        losses = optax.softmax_cross_entropy_with_integer_labels(logits, batch["targets"])
        weighted = np.asarray(losses, np.float64) * batch["weights"]
        total += float(np.sum(weighted))
        count += float(batch["weights"].sum())
        at_position += weighted.sum(0)
        at_position_count += batch["weights"].sum(0)
    return total / count, count, at_position / at_position_count


@pytest.mark.parametrize("position", ["txl", "rope"])
def test_blocks_of_segments_score_like_one_segment_at_a_time(monkeypatch, position):
    model = tiny_model(position, mem_len=24)
    # 3 rows of 333 targets: 21 segments of 16
    loss, count, by_position = _one_segment_at_a_time(model, 3, 16, 24)
    assert count == 999
    for per_call in (1, 4, 21, 64):  # 4: five blocks and one filled up; 64: one block of 21
        monkeypatch.setattr(evaluate_lib, "SEGMENTS_PER_CALL", per_call)
        result = evaluate_lib.evaluate(
            model, pipeline.ArrayStream(TOKENS), batch_size=3, segment_len=16, mem_len=24
        )
        assert result["tokens"] == 999, per_call
        np.testing.assert_allclose(result["loss"], loss, rtol=2e-6, err_msg=f"{per_call} a call")
        bits = by_position * evaluate_lib.BITS_PER_NAT
        np.testing.assert_allclose(result["bpc_by_position"], bits, rtol=2e-5, atol=1e-5)


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
