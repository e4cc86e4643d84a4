"""Bad input to a public function raises one ValueError naming the argument and the fix."""

from __future__ import annotations

import jax.numpy as jnp
import pytest

from relpos_jax import positions as P

ARANGE = jnp.arange(4)
BAD_CALLS = [
    ("sinusoid negative dim", lambda: P.sinusoid(ARANGE, -8), "dim=-8"),
    ("sinusoid odd dim", lambda: P.sinusoid(ARANGE, 7), "dim=7"),
    ("sinusoid zero base", lambda: P.sinusoid(ARANGE, 8, base=0.0), "base=0.0"),
    ("relative_sinusoid clamp 0", lambda: P.relative_sinusoid(8, 4, clamp_len=0), "clamp_len=0"),
    ("rel_shift 1-d", lambda: P.rel_shift(ARANGE), "x.shape"),
    (
        "txl window shorter than queries",
        lambda: P.txl_position_logits(jnp.ones((1, 5, 2, 4)), jnp.ones((3, 2, 4))),
        "r_KNH.shape[0]",
    ),
    ("shaw negative distance", lambda: P.shaw_index(ARANGE, -1), "max_distance=-1"),
    (
        "shaw even table",
        lambda: P.shaw_key_logits(jnp.ones((1, 4, 2, 3)), jnp.ones((4, 3)), ARANGE, ARANGE),
        "table.shape[0]=4",
    ),
    (
        "t5 odd bidirectional buckets",
        lambda: P.t5_bucket(ARANGE, bidirectional=True, num_buckets=7),
        "num_buckets=7",
    ),
    (
        "t5 max_distance too small",
        lambda: P.t5_bucket(ARANGE, bidirectional=False, max_distance=4),
        "max_distance=4",
    ),
    ("deberta odd bucket size", lambda: P.deberta_bucket(ARANGE, bucket_size=7), "bucket_size=7"),
    ("alibi zero heads", lambda: P.alibi_slopes(0), "num_heads=0"),
    ("alibi 2-d slopes", lambda: P.alibi_bias(ARANGE, ARANGE, jnp.ones((2, 2))), "slopes.shape"),
    ("rope negative head_dim", lambda: P.rope_inv_freq(-64), "head_dim=-64"),
    ("rope odd head_dim", lambda: P.rope_inv_freq(63), "head_dim=63"),
    (
        "rope unknown type",
        lambda: P.rope_inv_freq(64, scaling={"rope_type": "ntk-by-parts"}),
        "rope_type",
    ),
    (
        "rope misspelled key",
        lambda: P.rope_inv_freq(64, scaling={"rope_type": "linear", "factr": 2.0}),
        "'factr'",
    ),
    (
        "rope missing factor",
        lambda: P.rope_inv_freq(64, scaling={"rope_type": "linear"}),
        "scaling['factor']",
    ),
    (
        "rope yarn missing original",
        lambda: P.rope_inv_freq(64, scaling={"rope_type": "yarn", "factor": 2.0}),
        "scaling['original_max_position_embeddings']",
    ),
    (
        "rope negative factor",
        lambda: P.rope_inv_freq(64, scaling={"rope_type": "ntk", "factor": -2.0}),
        "scaling['factor']=-2.0",
    ),
    (
        "rope longrope wrong length",
        lambda: P.rope_inv_freq(
            64,
            scaling={
                "rope_type": "longrope",
                "short_factor": [1.0],
                "long_factor": [1.0],
                "factor": 2.0,
                "original_max_position_embeddings": 8,
            },
        ),
        "scaling['short_factor']",
    ),
    (
        "rope partial factor > 1",
        lambda: P.rope_inv_freq(64, partial_rotary_factor=2.0),
        "partial_rotary_factor=2.0",
    ),
    (
        "apply_rope too many frequencies",
        lambda: P.apply_rope(jnp.ones((1, 4, 2, 8)), ARANGE, jnp.ones(8)),
        "inv_freq.shape",
    ),
    ("learned lookup 1-d table", lambda: P.learned_lookup(jnp.ones(5), ARANGE), "table.shape"),
]


@pytest.mark.parametrize(
    ("call", "names"), [c[1:] for c in BAD_CALLS], ids=[c[0] for c in BAD_CALLS]
)
def test_bad_input_names_argument_and_fix(call, names):
    with pytest.raises(ValueError) as error:
        call()
    message = str(error.value)
    assert names in message, message
    # One line: "<function>: <argument>=<value> is invalid; <the fix>".
    assert "\n" not in message, message
    problem, _, fix = message.partition(" is invalid; ")
    assert ": " in problem and len(fix) > 10, message
