"""The layers as one scan over stacked parameters (``relpos_jax.layers``): the same model as layers
run one by one, the same weights for a seed as the layer-by-layer model drew, a program whose size
does not grow with depth, and checkpoints of the layer-by-layer model that still resume and
evaluate (``tests/fixtures/unrolled_checkpoint``, written by commit 7f351c4 with its ``make.py``)."""

from __future__ import annotations

import functools
import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from relpos_jax import TransformerLM, layers
from relpos_jax.config import Config, load_config
from relpos_jax.evaluate import restore_model
from relpos_jax.sharding import path_string
from relpos_jax.train import Trainer
from relpos_jax.train_step import make_optimizer, train_step_fn
from tests.helpers import ROOT, logged_losses, tiny_model

UNROLLED = ROOT / "tests" / "fixtures" / "unrolled_checkpoint"
EXPECTED = json.loads((UNROLLED / "expected.json").read_text())


@pytest.mark.parametrize("position", ["txl", "rope", "shaw"])
def test_the_scan_equals_the_layers_one_by_one(position):
    model = tiny_model(position, n_layers=3, mem_len=8)
    tokens = jnp.arange(12).reshape(2, 6) % 50
    _, mems = model(tokens, model.init_mems(2))  # a memory that holds states
    logits, new_mems = model(tokens + 1, mems)
    ctx = model._position_context(mems, 6, 0, None, True)
    x = model._add_absolute_positions(model._token_embeddings(tokens + 1), ctx.q_pos)
    inputs = []
    for index in range(3):
        inputs.append(x)
        x = model.layer(index)(x, mems.states[index], ctx, deterministic=True)
    np.testing.assert_allclose(model._logits(x), logits, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(new_mems.states[:, :, -6:], jnp.stack(inputs), rtol=1e-6)


@pytest.mark.parametrize("position", ["txl", "shaw"])
def test_a_seed_gives_the_weights_the_layer_by_layer_model_drew(position):
    sums = EXPECTED["init_abs_sums"]
    model = TransformerLM(
        dict(position=position, n_layers=3, d_model=32, n_heads=2, d_ff=64, mem_len=4, dropout=0.1),
        rngs=nnx.Rngs(params=0, dropout=1),
    )
    leaves = jax.tree_util.tree_flatten_with_path(nnx.state(model, nnx.Param))[0]
    ours = {path_string(p): np.abs(np.asarray(a, np.float64)) for p, a in leaves}
    # recorded when the scheme's parameters sat on the attention and the model themselves
    theirs = layers.positioned_paths(layers.stack_layer_paths(sums[position], np.array), ours)
    assert sorted(ours) == sorted(theirs)
    for path, weights in ours.items():
        got = [w.sum() for w in weights] if path.startswith("blocks/") else weights.sum()
        # the same draws; their last bits follow XLA's flags (the tests' are conftest.py's)
        np.testing.assert_allclose(got, theirs[path], rtol=1e-6, err_msg=path)


def test_parameters_are_stacked_with_a_layers_axis():
    model = tiny_model("txl", n_layers=3)
    w_q = model.blocks.attention.w_q
    assert w_q.shape == (3, 32, 4, 8)
    assert w_q.get_metadata()["axes"] == ("layers", "embed", "heads", "head_dim")
    np.testing.assert_array_equal(model.layer(2).attention.w_q[...], w_q[...][2])
    with pytest.raises(ValueError, match=r"index=3 is invalid; use 0…2"):
        model.layer(3)


def _train_step_program(n_layers: int) -> str:
    model = tiny_model("txl", n_layers=n_layers, mem_len=8, dropout=0.1)
    optimizer = nnx.Optimizer(model, make_optimizer(_train_config()), wrt=nnx.Param)
    graphdef, state = nnx.split((model, optimizer))
    batch = {k: jnp.zeros((2, 8), jnp.int32) for k in ("inputs", "targets")}
    step = jax.jit(functools.partial(train_step_fn, graphdef, 1))
    return step.lower(state, batch, model.init_mems(2)).as_text()


def _train_config():
    return Config.from_any(load_config(ROOT / "configs" / "txl_small.py")).train


def test_the_training_program_does_not_grow_with_depth():
    """One layer is traced and compiled whatever the depth: the step's program for 12 layers is
    the size of the one for 2 (the unrolled model's grew about sixfold)."""
    two, twelve = (len(_train_step_program(n)) for n in (2, 12))
    assert twelve < 1.02 * two, (two, twelve)


def test_stack_layer_paths_groups_layers_and_refuses_gaps():
    arrays = {"0/blocks/1/w": np.ones(2), "0/blocks/0/w": np.zeros(2), "0/embed": np.ones(3)}
    stacked = layers.stack_layer_paths(arrays)
    assert sorted(stacked) == ["0/blocks/w", "0/embed"]
    np.testing.assert_array_equal(stacked["0/blocks/w"], [[0, 0], [1, 1]])
    shapes = layers.stack_layer_paths(
        {"blocks/0/w": (2,), "blocks/1/w": (2,)}, layers.stacked_shape
    )
    assert shapes == {"blocks/w": (2, 2)}
    with pytest.raises(ValueError, match="has layers"):
        layers.stack_layer_paths({"blocks/0/w": 1, "blocks/2/w": 2})


def _unrolled_run(tmp_path, tiny):
    """The fixture's run folder (a checkpoint at step 2 of the layer-by-layer model) and its
    config, on the same corpus (rebuilt as conftest's ``tiny`` fixture builds it)."""
    config, _ = tiny
    config = config.copy_and_resolve_references()
    config.model.update(n_layers=2, d_model=32, n_heads=2, d_ff=64, mem_len=8, dropout=0.1)
    config.data.update(segment_len=8, batch_size=4)
    config.train.update(steps=4, log_every=1, eval_every=0, ckpt_every=2, warmup_steps=2)
    workdir = tmp_path / "run"
    shutil.copytree(UNROLLED / "checkpoints", workdir / "checkpoints")
    meta = workdir / "checkpoints" / "2" / "meta" / "metadata"  # the same corpus, at this path
    saved = json.loads(meta.read_text())
    saved["config"]["data"]["path"] = config.data.path
    meta.write_text(json.dumps(saved))
    return config, workdir


@pytest.mark.slow
def test_a_layer_by_layer_checkpoint_resumes_with_the_losses_it_would_have_logged(
    tmp_path, tiny, capfd
):
    config, workdir = _unrolled_run(tmp_path, tiny)
    trainer = Trainer(config, workdir)
    assert trainer.resumed_from == 2
    assert "holds its layers one by one" in capfd.readouterr().err
    trainer.run()
    expected = EXPECTED["losses"]
    resumed = dict(logged_losses(workdir))
    assert sorted(resumed) == [3, 4]
    for step, loss in resumed.items():
        np.testing.assert_allclose(loss, expected[str(step)], rtol=1e-5)
    assert not layers.has_layer_paths(  # saved again, stacked
        p.name for p in (workdir / "checkpoints" / "4" / "state").rglob("*")
    )
    model, _, step = restore_model(config, workdir)
    assert step == 4 and model.blocks.attention.w_q.shape[0] == 2


@pytest.mark.slow
def test_a_layer_by_layer_checkpoint_evaluates(tmp_path, tiny):
    config, workdir = _unrolled_run(tmp_path, tiny)
    model, _, step = restore_model(config, workdir)
    assert step == 2
    assert model.blocks.attention.w_q.shape == (2, 32, 2, 16)
    logits, _ = model(jnp.zeros((1, 8), jnp.int32))
    assert bool(jnp.isfinite(logits).all())
