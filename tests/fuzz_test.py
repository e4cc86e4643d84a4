"""Property-based fuzzing of what users type: config overrides and the position functions' arguments.

Whatever is drawn, the outcome is one of two: accepted (and then it works), or refused with one line
naming a real field or argument — never another exception type, never a traceback from deep inside.
"""

from __future__ import annotations

import dataclasses
import math
import re
import string

import hypothesis.strategies as st
import jax.numpy as jnp
import numpy as np
import pytest
from hypothesis import given, settings

from relpos_jax import positions as P
from relpos_jax.config import SECTIONS, Config, ConfigError, ModelConfig, load_config
from tests.helpers import ROOT

BASE = load_config(ROOT / "configs" / "txl_small.py").to_dict()
SCHEMA = {"model": ModelConfig, **SECTIONS}
FIELDS = sorted((s, f.name) for s, cls in SCHEMA.items() for f in dataclasses.fields(cls))
SETTINGS = [name for name in BASE["model"] if isinstance(BASE["model"][name], dict)
            and name != "rope_scaling"]  # fmt: skip
# each scheme's own settings, model.<scheme>.<field>, fuzzed field by field too
FIELDS += sorted(("model", f"{name}.{f}") for name in SETTINGS for f in BASE["model"][name])
FIELD_NAMES = {f"{s}.{f}" for s, f in FIELDS}
ONE_LINE = re.compile(r"^(?P<field>[a-z_.0-9]+)=.+ is invalid; .+$")

WILD = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(10**6), 10**6),
    st.sampled_from([0, 1, 2, 3, 7, 64, 255, 256, 1024]),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0.0, 0.5, 1.0, 1e-3, -1e-3, math.nan, math.inf]),
    st.text(string.printable, max_size=8),
    st.sampled_from(["txl", "rope", "adam", "float32", "bfloat16", "text", "tfds:x", ""]),
    st.lists(st.integers(-5, 5), max_size=3),
    st.dictionaries(st.sampled_from(["rope_type", "factor"]), st.integers(0, 9), max_size=2),
)


def _overridden(overrides) -> dict:
    config = {section: dict(values) for section, values in BASE.items()}
    for (section, field), value in overrides:
        where, _, field = field.rpartition(".")  # a scheme's setting: model.<scheme>.<field>
        if not where:
            config[section][field] = value
        elif isinstance(config[section][where], dict):  # (not replaced whole by an override)
            config[section][where] = {**config[section][where], field: value}
    return config


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.lists(st.tuples(st.sampled_from(FIELDS), WILD), min_size=1, max_size=3))
def test_any_config_override_is_accepted_or_refused_in_one_line(overrides):
    try:
        config = Config.from_any(_overridden(overrides))
    except ConfigError as error:
        match = ONE_LINE.match(str(error))
        assert match, str(error)
        named = match["field"]  # a field, or an unknown key of a scheme's settings
        assert named in FIELD_NAMES or named.rpartition(".")[0] in FIELD_NAMES, str(error)
        return
    for section, cls in SCHEMA.items():  # accepted: every number in it is a finite one
        for field in dataclasses.fields(cls):
            value = getattr(getattr(config, section), field.name)
            if isinstance(value, float):
                assert math.isfinite(value), (section, field.name, value)


@settings(max_examples=100, deadline=None, derandomize=True)
@given(
    st.sampled_from(sorted(SCHEMA)),
    st.text(string.ascii_lowercase + "_", min_size=1, max_size=12),
    WILD,
)
def test_unknown_fields_are_named(section, name, value):
    if (section, name) in FIELDS:
        return
    config = _overridden([])
    config[section][name] = value
    with pytest.raises(ConfigError) as error:
        Config.from_any(config)
    assert str(error.value).startswith(f"{section}.{name}=") and "\n" not in str(error.value)


# ----------------------------------------------------------------------------- position functions

SMALL = st.one_of(st.integers(-3, 40), st.sampled_from([0, 1, 2, 63, 64, 128]))
DISTANCES = jnp.arange(-6, 7)
POSITION_CALLS = {
    "sinusoid": (lambda a, b: P.sinusoid(jnp.arange(4), a, base=float(b)), ("dim", "base")),
    "relative_sinusoid": (
        lambda a, b: P.relative_sinusoid(a, 8, clamp_len=b),
        ("k_len", "clamp_len"),
    ),
    "relative_distances": (lambda a, b: P.relative_distances(a, b), ("k_len", "clamp_len")),
    "alibi_slopes": (lambda a, b: P.alibi_slopes(a), ("num_heads",)),
    "shaw_index": (lambda a, b: P.shaw_index(DISTANCES, a), ("max_distance",)),
    "t5_bucket": (
        lambda a, b: P.t5_bucket(DISTANCES, bidirectional=True, num_buckets=a, max_distance=b),
        ("num_buckets", "max_distance"),
    ),
    "deberta_bucket": (
        lambda a, b: P.deberta_bucket(DISTANCES, bucket_size=a, max_position=b),
        ("bucket_size", "max_position"),
    ),
    "rope_inv_freq": (lambda a, b: P.rope_inv_freq(a, float(b)), ("head_dim", "base")),
    "rope_inv_freq yarn": (
        lambda a, b: P.rope_inv_freq(
            16,
            10000.0,
            {"rope_type": "yarn", "factor": float(a), "original_max_position_embeddings": b},
        ),
        ("scaling", "factor", "original_max_position_embeddings"),
    ),
    "rope_inv_freq llama3": (
        lambda a, b: P.rope_inv_freq(
            16,
            500000.0,
            {
                "rope_type": "llama3",
                "factor": 8.0,
                "low_freq_factor": float(a),
                "high_freq_factor": float(b),
                "original_max_position_embeddings": 8192,
            },
        ),
        ("low_freq_factor", "high_freq_factor"),
    ),
    "deberta_scale": (lambda a, b: P.deberta_scale(a, b), ("head_dim", "num_position_terms")),
}


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.sampled_from(sorted(POSITION_CALLS)), SMALL, SMALL)
def test_position_functions_compute_or_refuse_in_one_line(name, a, b):
    call, arguments = POSITION_CALLS[name]
    try:
        result = call(a, b)
    except ValueError as error:
        message = str(error)
        assert "\n" not in message and "invalid" in message, message
        assert any(argument in message for argument in arguments), message
        return
    for array in result if isinstance(result, tuple) else (result,):
        assert np.all(np.isfinite(np.asarray(array, dtype=np.float64))), (name, a, b)
