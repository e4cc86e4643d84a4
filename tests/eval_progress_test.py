"""A stopped evaluation pass goes on where it stopped (``relpos_jax.eval_progress``): the same
result, bit for bit, as one pass, scoring only the blocks that were not kept, and a pass that ended
but whose result was not stored yet scores nothing again; a file kept for another pass, or one that
cannot be read, is ignored."""

import jax.numpy as jnp
import numpy as np
import pytest

from relpos_jax import eval_progress
from relpos_jax import evaluate as evaluate_lib
from relpos_jax.data import pipeline
from relpos_jax.eval_progress import PassProgress
from tests.helpers import evaluation_stopped_before_call, tiny_model

TOKENS = np.random.default_rng(3).integers(0, 256, 700)
PASSES = {  # 2 rows of 349 targets in 22 segments of 16 (memory 24); 43 sliding windows of 32
    "segments, memory": lambda model, progress: evaluate_lib.evaluate(
        model, pipeline.ArrayStream(TOKENS), batch_size=2, segment_len=16, mem_len=24,
        progress=progress,
    ),
    "sliding": lambda model, progress: evaluate_lib.evaluate_sliding(
        model, pipeline.ArrayStream(TOKENS), batch_size=1, window=32, stride=16,
        progress=progress,
    ),
}  # fmt: skip


def _same(result, reference):
    assert result["loss"] == reference["loss"] and result["tokens"] == reference["tokens"]
    assert result["bpc_by_position"] == reference["bpc_by_position"]
    for field in ("bits", "tokens"):
        np.testing.assert_array_equal(result["windows"][field], reference["windows"][field])


@pytest.mark.parametrize("protocol", sorted(PASSES))
def test_a_stopped_pass_goes_on_where_it_stopped_to_the_same_result(
    monkeypatch, tmp_path, protocol
):
    monkeypatch.setattr(evaluate_lib, "SEGMENTS_PER_CALL", 4)
    model, score = tiny_model("txl", mem_len=24), PASSES[protocol]
    reference = score(model, None)
    path = tmp_path / "pass.npz"
    calls = []
    counted = evaluate_lib.score_segments
    monkeypatch.setattr(evaluate_lib, "score_segments", lambda *a: calls.append(1) or counted(*a))
    with evaluation_stopped_before_call(monkeypatch, 3):  # kept after each call
        score(model, PassProgress(path, "this pass", every_s=0))
    assert path.is_file() and len(calls) == 3
    blocks, sums, _ = PassProgress(path, "this pass").resumed()
    assert blocks == 3 and len(sums) == 1 and sums[0]["row_loss"].shape[0] == 3 * 4
    calls.clear()
    every_block = len(list(evaluate_lib._blocks(_batches(protocol), 4)))
    # taken up (and kept once a minute, never in so short a pass): only the blocks not kept
    resumed = score(model, PassProgress(path, "this pass"))
    assert len(calls) == every_block - 3 and every_block > 3
    _same(resumed, reference)
    # kept whole at its end, until the caller has stored the result: stopped before, nothing lost
    assert PassProgress(path, "this pass").resumed()[0] == every_block
    calls.clear()
    _same(score(model, PassProgress(path, "this pass")), reference)
    assert not calls
    PassProgress(path, "this pass").done()
    assert not path.exists()
    # kept after every block all the way: the same again
    _same(score(model, PassProgress(path, "this pass", every_s=0)), reference)


def _batches(protocol: str):
    stream = pipeline.ArrayStream(TOKENS)
    if protocol == "sliding":
        return pipeline.sliding_batches(stream, 1, 32, 16, None)
    return pipeline.eval_batches(stream, 2, 16, None)


def test_progress_kept_for_another_pass_or_unreadable_is_ignored(tmp_path):
    path = tmp_path / "pass.npz"
    sums = [{"row_loss": np.ones((2, 3)), "position_loss": np.ones(4)}]
    merged = PassProgress(path, "at 64", every_s=0).keep(
        1, sums, {"k": np.zeros((2, 5))}, "2 a call"
    )
    assert merged[0]["row_loss"].dtype == np.float64
    assert PassProgress(path, "at 64").resumed()[0] == 1
    assert PassProgress(path, "at 64").resumed("2 a call")[0] == 1
    assert PassProgress(path, "at 128").resumed() == (0, [], None)
    assert PassProgress(path, "at 64").resumed("4 a call") == (0, [], None)  # cut otherwise
    path.write_bytes(b"half a file")
    assert PassProgress(path, "at 64").resumed() == (0, [], None)
    PassProgress(path, "at 64").done()
    PassProgress(path, "at 64").done()  # nothing to remove: no error
    assert not path.exists()


def test_blocks_merge_as_evaluate_adds_them():
    blocks = [
        {"row_loss": np.full((2, 3), k, np.float32), "position_loss": np.full(5, 0.1 * k)}
        for k in range(1, 4)
    ]
    merged = eval_progress.merge(blocks[:2])
    again = eval_progress.merge([merged, blocks[2]])
    whole = eval_progress.merge(blocks)
    np.testing.assert_array_equal(again["row_loss"], whole["row_loss"])
    assert again["row_loss"].shape == (6, 3)
    np.testing.assert_array_equal(again["position_loss"], whole["position_loss"])  # same order


def test_a_kept_memory_comes_back_exactly_in_its_own_dtype(tmp_path):
    memory = {"keys": jnp.linspace(-3, 3, 24, dtype=jnp.bfloat16).reshape(2, 12), "steps": 7}
    path = tmp_path / "pass.npz"
    PassProgress(path, "k").keep(1, [{"row_loss": np.zeros((1, 2))}], memory, "1 a call")
    _, _, leaves = PassProgress(path, "k").resumed()
    back = eval_progress.restored({"keys": jnp.zeros((2, 12), jnp.bfloat16), "steps": 0}, leaves)
    assert back["keys"].dtype == jnp.bfloat16 and back["steps"] == 7
    np.testing.assert_array_equal(np.asarray(back["keys"], np.float32),
                                  np.asarray(memory["keys"], np.float32))  # fmt: skip
    with pytest.raises(ValueError, match="kept memory does not match"):
        eval_progress.restored({"keys": jnp.zeros((3, 12), jnp.bfloat16), "steps": 0}, leaves)
