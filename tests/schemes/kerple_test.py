"""KERPLE (logarithmic) against a float64 loop of its formula; translation invariant; trainable; one
pair of parameters shared by the layers (the authors') or a pair per layer; kept ≥ 1e-2 by a
projection after each update, with the gradient passing at the floor; checkpoints of either layout."""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from relpos_jax import TransformerLM, schemes, train_step
from relpos_jax.attention import Attention
from relpos_jax.checkpoint import Checkpointer, sections
from relpos_jax.config import Config, ConfigError, ModelConfig

SMALL = dict(position="kerple", d_model=16, n_heads=4, d_ff=32)
CFG = ModelConfig.from_any(SMALL)
PER_LAYER = ModelConfig.from_any(dict(SMALL, kerple={"per_layer": True}))
FLOOR = np.float32(1e-2)


def _bias(attention, q_pos, k_pos, context=None):
    tile = schemes.Tile(jnp.asarray(q_pos), jnp.asarray(k_pos), 0, 0)
    return np.asarray(schemes.get("kerple").bias(attention.position, tile, context), np.float64)


def _reference(r1, r2, q_pos, k_pos):
    r1 = np.maximum(np.asarray(r1, np.float64), 1e-2)
    r2 = np.maximum(np.asarray(r2, np.float64), 1e-2)
    want = np.zeros((len(r1), len(q_pos), len(k_pos)))
    for n in range(len(r1)):
        for i, qi in enumerate(q_pos):
            for j, kj in enumerate(k_pos):
                want[n, i, j] = -r1[n] * math.log(1 + r2[n] * abs(qi - kj))
    return want


def _context(model):
    return schemes.get("kerple").context(model, None, None, True)


def test_kerple_bias_is_minus_r1_log_one_plus_r2_distance():
    q_pos, k_pos = np.arange(3, 9), np.arange(0, 9)
    r2 = jnp.asarray([0.5, 1e-3, 1.0, 2.0])  # 1e-3 (below the floor) reads as 1e-2
    attention = Attention(PER_LAYER, rngs=nnx.Rngs(0))  # per layer: the layer's own pair
    attention.position.kerple_r2.set_value(r2)
    want = _reference(attention.position.kerple_r1[...], r2, q_pos, k_pos)
    np.testing.assert_allclose(_bias(attention, q_pos, k_pos), want, rtol=1e-6, atol=1e-6)
    model = TransformerLM(CFG, rngs=nnx.Rngs(0))  # shared: the model's pair, through the context
    model.position.kerple_r2.set_value(r2)
    want = _reference(model.position.kerple_r1[...], r2, q_pos, k_pos)
    got = _bias(model.layer(0).attention, q_pos, k_pos, _context(model))
    np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_kerple_is_translation_invariant():
    attention = Attention(PER_LAYER, rngs=nnx.Rngs(1))
    q_pos, k_pos = np.arange(5, 12), np.arange(0, 12)
    shifted = _bias(attention, q_pos + 1000, k_pos + 1000)
    np.testing.assert_allclose(shifted, _bias(attention, q_pos, k_pos), rtol=1e-6)


def _named_grads(model, tokens):
    loss = lambda m, tokens: m(tokens, m.init_mems(2))[0].std()  # noqa: E731
    grads = nnx.jit(nnx.grad(loss))(model, tokens)
    return {jax.tree_util.keystr(path): leaf for path, leaf in jax.tree.leaves_with_path(grads)}


def _kerple_params(model) -> dict[str, np.ndarray]:
    """Every KERPLE parameter of ``model`` by its path."""
    state = nnx.state(model, nnx.Param)
    return {
        jax.tree_util.keystr(path): np.asarray(leaf)
        for path, leaf in jax.tree.leaves_with_path(state)
        if "kerple_r" in jax.tree_util.keystr(path)
    }


def test_kerple_shares_one_pair_by_default_and_has_a_pair_per_layer_as_an_option():
    shared = _kerple_params(TransformerLM(CFG, rngs=nnx.Rngs(0)))
    per_layer = _kerple_params(TransformerLM(PER_LAYER, rngs=nnx.Rngs(0)))
    n, layers = CFG.n_heads, CFG.n_layers
    assert sorted(v.shape for v in shared.values()) == [(n,), (n,)]  # 2·N, on the model
    assert all("blocks" not in name for name in shared)
    assert sorted(v.shape for v in per_layer.values()) == [(layers, n), (layers, n)]  # 2·L·N
    assert all("blocks" in name for name in per_layer)
    for values in (shared, per_layer):  # stored at or above the floor from init
        assert all(v.min() >= FLOOR for v in values.values())


@pytest.mark.parametrize("config", [CFG, PER_LAYER], ids=["shared", "per layer"])
def test_kerple_parameters_get_gradients_through_the_model(config):
    model = TransformerLM(config, rngs=nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.PRNGKey(0), (2, 8), 0, 256)
    named = _named_grads(model, tokens)
    kerple = [name for name in named if "kerple_r" in name]
    assert len(kerple) == 2
    for name in kerple:
        per_head = np.abs(np.asarray(named[name])).reshape(-1, config.n_heads)
        assert np.all(per_head > 0), (name, per_head)  # every head (of every layer)


def test_kerple_parameters_at_or_below_the_floor_still_get_a_gradient():
    """The forward reads max(r, 1e-2) with r's own gradient: a parameter at the floor can climb
    back (a max in the forward gave it none below the floor, half of it at the floor)."""
    model = TransformerLM(CFG, rngs=nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.PRNGKey(0), (2, 8), 0, 256)
    for value in (1e-2, 1e-3):
        model.position.kerple_r1.set_value(jnp.full((CFG.n_heads,), value, jnp.float32))
        model.position.kerple_r2.set_value(jnp.full((CFG.n_heads,), value, jnp.float32))
        named = _named_grads(model, tokens)
        for name in ("kerple_r1", "kerple_r2"):
            (grad,) = [leaf for key, leaf in named.items() if name in key]
            assert np.all(np.abs(np.asarray(grad)) > 0), (value, name, grad)


def test_apply_floors_sets_values_below_the_floor_to_exactly_the_floor():
    for config in (CFG, PER_LAYER):
        model = TransformerLM(config, rngs=nnx.Rngs(0))
        owner = (model if config is CFG else model.blocks.attention).position
        below = jnp.asarray([-0.5, 0.0, 0.004, 0.7], jnp.float32)
        owner.kerple_r1.set_value(jnp.broadcast_to(below, owner.kerple_r1[...].shape))
        schemes.apply_floors(model)
        got = np.asarray(owner.kerple_r1[...]).reshape(-1, 4)
        np.testing.assert_array_equal(
            got, np.broadcast_to(np.float32([FLOOR, FLOOR, FLOOR, 0.7]), got.shape)
        )


def test_a_training_step_leaves_every_kerple_parameter_at_or_above_the_floor():
    """A learning rate of 1 pushes half the parameters (Adam's first step: ±lr) far below 1e-2;
    the projection after the update puts them at the floor itself, not near it."""
    config = Config.from_any(
        dict(
            model=dict(SMALL, n_layers=2, mem_len=4, dropout=0.0),
            data=dict(segment_len=8, batch_size=2),
            train=dict(lr=1.0, clip=0.0),
        )
    )
    model, optimizer = train_step.build(config)
    graphdef, state = nnx.split((model, optimizer))
    step = jax.jit(functools.partial(train_step.train_step_fn, graphdef, 1))
    tokens = jax.random.randint(jax.random.PRNGKey(0), (2, 9), 0, 256)
    batch = {"inputs": tokens[:, :-1], "targets": tokens[:, 1:]}
    state, _, metrics = step(state, batch, model.init_mems(2))
    assert bool(metrics["finite"])
    model, _ = nnx.merge(graphdef, state)
    values = np.concatenate(
        [np.asarray(model.position.kerple_r1[...]), np.asarray(model.position.kerple_r2[...])]
    )
    assert values.min() == FLOOR and (values == FLOOR).sum() >= 2, values
    assert values.max() > 0.9  # the others moved up by about lr


def _saved(tmp_path, per_layer: bool, recorded: bool):
    """A checkpoint of a KERPLE model (per layer or shared); ``recorded``: its config meta names
    model.kerple.per_layer (False: written before the field existed)."""
    config = Config.from_any(dict(model=dict(SMALL, n_layers=2, kerple={"per_layer": per_layer})))
    model = TransformerLM(config.model, rngs=nnx.Rngs(0))
    state = nnx.state(model, nnx.Param)
    meta = sections(config)
    if not recorded:
        meta["model"].pop("kerple.per_layer")
    checkpointer = Checkpointer(tmp_path / "checkpoints")
    mems = model.init_mems(1)
    checkpointer.save(1, state=state, mems=mems, data={}, meta={"step": 1, "config": meta})
    checkpointer.wait()
    return checkpointer, state, mems


def _target(per_layer: bool):
    config = Config.from_any(dict(model=dict(SMALL, n_layers=2, kerple={"per_layer": per_layer})))
    return config, nnx.state(TransformerLM(config.model, rngs=nnx.Rngs(1)), nnx.Param)


def test_checkpoints_with_kerple_per_layer_load_with_it_or_fail_naming_it(tmp_path):
    # written before model.kerple.per_layer, when the parameters were per layer
    checkpointer, saved, mems = _saved(tmp_path / "old", per_layer=True, recorded=False)
    config, state = _target(per_layer=False)  # today's default: shared
    with pytest.raises(ConfigError) as error:
        checkpointer.check_compatible(1, state, config)
    message = str(error.value)
    assert "model.kerple.per_layer" in message and "\n" not in message, message
    config, state = _target(per_layer=True)  # with the field set: loads
    checkpointer.check_compatible(1, state, config)
    restored = checkpointer.restore(1, state=state, mems=mems)["state"]
    for x, y in zip(jax.tree.leaves(restored), jax.tree.leaves(saved), strict=True):
        np.testing.assert_array_equal(x, y)
    checkpointer.close()
    # written with the field: the one-line mismatch of any config field
    checkpointer, _, _ = _saved(tmp_path / "new", per_layer=False, recorded=True)
    config, state = _target(per_layer=True)
    with pytest.raises(ConfigError, match=r"^model\.kerple\.per_layer=True is invalid; .*False"):
        checkpointer.check_compatible(1, state, config)
    checkpointer.close()
