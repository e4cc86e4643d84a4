"""Memory probes: answers exactly ``distance`` back, the same pipeline as any corpus, and scoring."""

from __future__ import annotations

import numpy as np
import pytest

from relpos_jax import data
from relpos_jax.analysis.probing import accuracy_by_distance, probe_accuracy
from relpos_jax.data import probes
from tests.helpers import tiny_model


@pytest.mark.parametrize("distance", [64, 100, 333])
def test_every_answer_sits_exactly_distance_back(distance):
    for doc in probes.documents("passkey", distance, 5, seed=0):
        first = int(np.flatnonzero(doc.answer)[0])
        key = doc.text.index(b"The pass key is ") + len(b"The pass key is ")
        assert first - key == distance
        assert doc.text[key : key + 5] == doc.text[first : first + 5] and doc.answer.sum() == 5
    for doc in probes.documents("copy", distance, 5, seed=0):
        answer = np.flatnonzero(doc.answer)
        assert len(answer) == distance - 1
        originals = answer - distance
        assert doc.text[originals[0] - 1 : originals[0]] == b" "  # right after "copy: "
        assert bytes(doc.text[i] for i in originals) == bytes(doc.text[i] for i in answer)
    for doc in probes.documents("recall", distance, 5, seed=0):
        (answer,) = np.flatnonzero(doc.answer)
        listing_end = doc.text.index(b" ", doc.text.rindex(b"=")) + 1
        assert answer - listing_end == distance
        query = doc.text[answer - 3 : answer - 1].decode()
        assert f"{query}={chr(doc.text[answer])}".encode() in doc.text[:listing_end]
    for doc in probes.documents("needle", distance, 5, seed=0):
        (answer,) = np.flatnonzero(doc.answer)
        key = doc.text.index(b"key ") + len(b"key ")
        assert answer - key == distance and doc.text[key] == doc.text[answer]
        assert doc.text[answer - 1 : answer] == b"?" and doc.text.count(b"?") == 1
        assert sum(chr(b).isdigit() for b in doc.text) == 2  # the key and the answer, nothing else


def test_probe_datasets_flow_through_the_same_pipeline(tmp_path):
    stream = data.open_split("probe:recall:80", "valid", data_dir=str(tmp_path))
    expected = b"".join(probes.split_stream("probe:recall:80", "valid"))
    assert stream.read(0, len(stream)).tobytes() == expected
    assert len(expected) >= probes.SPLIT_BYTES["valid"]
    train = data.open_split("probe:recall:80", "train", data_dir=str(tmp_path))
    assert train.read(0, 1000).tobytes() != stream.read(0, 1000).tobytes()  # splits differ


@pytest.mark.parametrize(
    "name",
    [
        "probe:passkey",
        "probe:passkey:12",
        "probe:sort:100",
        "probe:copy:x",
        "probes:copy:99",
        "probe:needle:40-20",
        "probe:needle:4-20",
        "probe:needle:8-20-30",
        "probe:needle:8-",
    ],
)
def test_bad_probe_names_are_one_line(name, tmp_path):
    with pytest.raises(data.DataError) as error:
        data.open_split(name, "train", data_dir=str(tmp_path))
    assert "\n" not in str(error.value) and "probe:<kind>:<distance>" in str(error.value)


def test_a_distance_range_mixes_distances_within_it():
    assert probes.parse("probe:needle:8-96") == ("needle", 8, 96)
    assert probes.parse("probe:needle:24") == ("needle", 24, 24)
    text = b"".join(probes.split_stream("probe:needle:8-96", "valid"))
    docs = text.split(b"\n")[:-1]
    keys = [doc.index(b"key ") + len(b"key ") for doc in docs]
    distances = [len(doc) - 1 - key for doc, key in zip(docs, keys, strict=True)]
    assert min(distances) == 8 and max(distances) == 96 and len(set(distances)) == 89
    assert all(doc[key] == doc[-1] for doc, key in zip(docs, keys, strict=True))
    fixed = b"".join(probes.split_stream("probe:needle:24", "valid")).split(b"\n")[:-1]
    assert {len(doc) - 1 - (doc.index(b"key ") + 4) for doc in fixed} == {24}


def test_scoring_refuses_a_range_in_one_line():
    with pytest.raises(data.DataError, match="one distance at a time") as error:
        probe_accuracy(tiny_model("txl"), "probe:needle:8-96", segment_len=16, mem_len=16)
    assert "\n" not in str(error.value)


def test_scoring_with_memory_equals_scoring_the_whole_row_at_once():
    model = tiny_model("txl", mem_len=400)
    settings = dict(documents=6, batch_size=2, seed=1)
    by_segments = probe_accuracy(model, "probe:passkey:64", segment_len=16, mem_len=400, **settings)
    whole = probe_accuracy(model, "probe:passkey:64", segment_len=400, mem_len=0, **settings)
    assert by_segments["byte_accuracy"] == whole["byte_accuracy"]
    assert by_segments["documents"] == 6 and 0 <= by_segments["document_accuracy"] <= 1


def test_accuracy_by_distance_reports_each_distance():
    model = tiny_model("rope", mem_len=0)
    curve = accuracy_by_distance(
        model, "copy", [64, 70], segment_len=32, mem_len=0, documents=2, batch_size=2
    )
    assert [c["distance"] for c in curve] == [64, 70] and curve[0]["chance"] == pytest.approx(
        1 / 26
    )


def test_each_prediction_is_scored_against_the_next_byte(monkeypatch):
    """A predictor that repeats its input byte scores the rate at which an answer byte repeats the
    byte before it: each prediction meets its own target, not its input."""
    from relpos_jax.analysis import probing

    monkeypatch.setattr(probing, "predict", lambda graphdef, state, segments, mems: segments)
    docs = probes.documents("copy", 64, 4, 5)
    repeats = [d.text[j] == d.text[j - 1] for d in docs for j in np.flatnonzero(d.answer) if j > 0]
    result = probe_accuracy(
        tiny_model("txl"), "probe:copy:64", segment_len=16, mem_len=16, documents=4, seed=5
    )
    assert result["byte_accuracy"] == pytest.approx(np.mean(repeats))
    assert result["byte_accuracy"] < 0.5


def test_only_answers_whose_key_is_within_reach_are_scored_when_asked(monkeypatch):
    """A predictor that looks ``distance`` back inside its own segment (never before it) is right at
    exactly the answers whose key is within reach: all of them when those alone are scored, and the
    reachable share of them when every answer is."""
    from relpos_jax.analysis import probing

    distance, segment = 24, 32

    def lookup_in_segment(graphdef, state, segments, mems):
        segments = np.asarray(segments)  # position t predicts t + 1 from t + 1 − distance
        found = np.zeros_like(segments)
        found[..., distance - 1 :] = segments[..., : segment - distance + 1]
        return found

    monkeypatch.setattr(probing, "predict", lookup_in_segment)
    settings = dict(segment_len=segment, mem_len=0, documents=40, batch_size=4, seed=2)
    model, name = tiny_model("txl"), f"probe:needle:{distance}"
    everything = probe_accuracy(model, name, **settings)
    reachable = probe_accuracy(model, name, reachable_only=True, **settings)
    assert 0.1 < everything["reachable"] < 0.9  # some keys fall in the segment before
    assert everything["byte_accuracy"] == pytest.approx(everything["reachable"])
    assert reachable["byte_accuracy"] == reachable["document_accuracy"] == 1.0
    with_memory = probe_accuracy(model, name, **{**settings, "mem_len": distance})
    assert with_memory["reachable"] == 1.0


def test_within_reach_is_the_segment_so_far_and_the_memory():
    from relpos_jax.analysis.probing import within_reach

    reach = within_reach(8, 3, segment_len=4, mem_len=0)
    assert reach.tolist() == [False, False, True, True] * 2  # offsets 2 and 3 reach 3 back
    assert within_reach(8, 5, segment_len=4, mem_len=2).tolist() == [False, False, True, True] * 2
    assert within_reach(8, 2, segment_len=4, mem_len=1).all()
