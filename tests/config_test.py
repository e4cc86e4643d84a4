"""Config files load; bad model configuration is refused at construction with one clear line."""

from __future__ import annotations

import pathlib

import jax
import pytest
from flax import nnx

from relpos_jax import ConfigError, ModelConfig, TransformerLM, load_config
from relpos_jax.config import POSITIONS, Config

CONFIGS = sorted((pathlib.Path(__file__).resolve().parent.parent / "configs").glob("*.py"))
CONFIGS = [c for c in CONFIGS if c.name != "__init__.py"]


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_config_file_loads_and_validates(path):
    config = load_config(path)
    model = ModelConfig.from_any(config.model)
    assert model.position in POSITIONS


def test_scheme_configs_cover_every_position_scheme():
    schemes = {load_config(path).model.position for path in CONFIGS}
    assert schemes == set(POSITIONS)


def test_txl_small_has_the_research_sizes():
    model = ModelConfig.from_any(load_config(CONFIGS[0].parent / "txl_small.py").model)
    assert (
        model.n_layers,
        model.d_model,
        model.n_heads,
        model.head_dim,
        model.d_ff,
        model.mem_len,
    ) == (6, 256, 4, 64, 1024, 128)


BAD = [
    (dict(n_heads=3), "model.n_heads=3"),
    (dict(position="transformer-xl"), "model.position='transformer-xl'"),
    (dict(mem_len=-1), "model.mem_len=-1"),
    (dict(clamp_len=0), "model.clamp_len=0"),
    (dict(position="rope", d_head=63, n_heads=4), "model.d_head=63"),
    (dict(position="rope", rope_scaling={"rope_type": "yarn"}), "model.rope_scaling"),
    (dict(dropout=1.5), "model.dropout=1.5"),
    (dict(n_layer=6), "model.n_layer=6"),
    (dict(position="t5", t5={"num_buckets": 32, "max_distance": 8}), "model.t5.max_distance=8"),
    (dict(position="shaw", shaw={"max_distance": 0}), "model.shaw.max_distance=0"),
    (dict(shaw_max_distance=8), "model.shaw_max_distance=8 is invalid; renamed: use model.shaw"),
    (dict(txl={"untie": True}), "model.txl.untie=True"),
    # a scheme's settings are checked whichever scheme runs: a bad value is never silently unused
    (dict(position="txl", t5={"num_buckets": 0}), "model.t5.num_buckets=0"),
    (dict(position="alibi", fire={"init_c": -1.0}), "model.fire.init_c=-1.0"),
    (dict(position="rope", xpos={"gamma": 0.0}), "model.xpos.gamma=0.0"),
]


@pytest.mark.parametrize(("overrides", "names"), BAD, ids=[b[1] for b in BAD])
def test_bad_model_config_is_refused_at_construction(overrides, names):
    with pytest.raises(ConfigError) as error:
        TransformerLM(overrides, rngs=nnx.Rngs(0))
    message = str(error.value)
    assert message.startswith(names) and "\n" not in message and " is invalid; " in message, message


def test_missing_config_file_is_one_line():
    with pytest.raises(ConfigError, match=r"config='nope\.py' is invalid"):
        load_config("nope.py")


def test_a_model_with_rope_scaling_runs_under_jit():
    """rope_scaling is a dict in configs; the validated config must stay hashable (jit statics)."""
    import numpy as np

    from relpos_jax.data import ArrayStream
    from relpos_jax.evaluate import evaluate
    from tests.helpers import tiny_model

    scaling = {"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 16}
    model = tiny_model("rope", rope_scaling=scaling)
    stream = ArrayStream(np.arange(100) % 256)
    result = evaluate(model, stream, batch_size=2, segment_len=8, mem_len=0)
    assert result["tokens"] == 99 and np.isfinite(result["bpc"])


@pytest.mark.parametrize(
    ("name", "millions"), [("txl_base_enwik8", 41.1), ("txl_large_enwik8", 277.3)]
)
def test_enwik8_configs_build_the_papers_models(name, millions):
    """The paper's Table 2: 41M parameters for the 12-layer model, 277M for the 24-layer one."""
    cfg = Config.from_any(load_config(CONFIGS[0].parent / f"{name}.py"))
    model = nnx.eval_shape(lambda: TransformerLM(cfg.model, rngs=nnx.Rngs(0)))
    count = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    assert count / 1e6 == pytest.approx(millions, abs=0.05)
