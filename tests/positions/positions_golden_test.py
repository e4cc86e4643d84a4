"""Published formulas against numbers their authors' code produced (tests/positions/golden/*.json).

The golden values were computed once by running HuggingFace transformers (T5, DeBERTa-v2, RoPE
scaling, Llama's apply_rotary_pos_emb) and the ALiBi authors' ``get_slopes``; each entry's ``source``
names the exact call. No torch is needed to run these tests.
"""

from __future__ import annotations

import json
import pathlib

import jax.numpy as jnp
import numpy as np
import pytest

from relpos_jax import positions as P

GOLDEN = json.loads(
    (pathlib.Path(__file__).parent / "golden" / "positions_golden.json").read_text()
)


@pytest.mark.parametrize(
    "case", GOLDEN["t5"]["cases"], ids=lambda c: f"{c['bidirectional']}-{c['num_buckets']}"
)
def test_t5_bucket_matches_t5(case):
    key_minus_query = np.asarray(GOLDEN["t5"]["key_minus_query"])
    got = P.t5_bucket(
        jnp.asarray(-key_minus_query),
        bidirectional=case["bidirectional"],
        num_buckets=case["num_buckets"],
        max_distance=case["max_distance"],
    )
    np.testing.assert_array_equal(got, case["buckets"])


@pytest.mark.parametrize("case", GOLDEN["deberta"]["cases"], ids=lambda c: str(c["bucket_size"]))
def test_deberta_bucket_matches_deberta_v2(case):
    rel = jnp.asarray(GOLDEN["deberta"]["query_minus_key"])
    got = P.deberta_bucket(rel, case["bucket_size"], case["max_position"])
    np.testing.assert_array_equal(got, case["buckets"])


@pytest.mark.parametrize("num_heads", sorted(GOLDEN["alibi"]["slopes"], key=int))
def test_alibi_slopes_match_authors(num_heads):
    want = np.asarray(GOLDEN["alibi"]["slopes"][num_heads], np.float32)
    np.testing.assert_array_equal(P.alibi_slopes(int(num_heads)), want)


@pytest.mark.parametrize("case", GOLDEN["rope_inv_freq"]["cases"], ids=lambda c: c["name"])
def test_rope_inv_freq_matches_huggingface(case):
    inv_freq, attention_factor = P.rope_inv_freq(
        case["head_dim"],
        case["base"],
        case["scaling"],
        case["seq_len"],
        partial_rotary_factor=case.get("partial_rotary_factor"),
    )
    np.testing.assert_allclose(inv_freq, case["inv_freq"], rtol=2e-6, atol=0)
    assert attention_factor == pytest.approx(case["attention_factor"], rel=1e-12)


def test_rope_inv_freq_traced_seq_len_matches_python_int():
    """Dynamic kinds take a traced seq_len (e.g. inside jit) and agree with the Python-int path."""
    import jax

    for case in GOLDEN["rope_inv_freq"]["cases"]:
        if case["seq_len"] is None:
            continue
        traced = jax.jit(
            lambda s, c=case: P.rope_inv_freq(c["head_dim"], c["base"], c["scaling"], s)[0]
        )
        np.testing.assert_allclose(traced(case["seq_len"]), case["inv_freq"], rtol=2e-6)


def test_apply_rope_matches_llama():
    g = GOLDEN["apply_rope"]
    # HF's layout is [batch, heads, seq, head_dim]; ours is [batch, seq, heads, head_dim].
    q = jnp.asarray(np.swapaxes(np.asarray(g["q_in"]), 1, 2), jnp.float32)
    k = jnp.asarray(np.swapaxes(np.asarray(g["k_in"]), 1, 2), jnp.float32)
    inv_freq = jnp.asarray(g["inv_freq"], jnp.float32)
    positions = jnp.asarray(g["positions"])
    for x, want in ((q, g["q_out"]), (k, g["k_out"])):
        got = np.swapaxes(np.asarray(P.apply_rope(x, positions, inv_freq)), 1, 2)
        np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-6)
