"""The adaptive vocabulary against a float64 loop reference written from the papers' formulas and
the official code: its embeddings, every word's log-probability, the loss and every gradient, for
one table (div_val 1) and per-cluster tables (div_val 2), tied and untied; then in the model
(``model.cutoffs``), through a training run that checkpoints and resumes."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from relpos_jax import TransformerLM
from relpos_jax.adaptive import AdaptiveVocab
from relpos_jax.errors import ConfigError
from relpos_jax.train import Trainer

V, D, CUTOFFS = 23, 8, (5, 11, 17)  # a shortlist of 5 words, tails of 6, 6 and 6


def _vocab(div_val, tie_weight=True, tie_projs=None, d_embed=16, chunk=4096):
    return AdaptiveVocab(
        V, D, CUTOFFS, d_embed=d_embed, div_val=div_val, tie_weight=tie_weight,
        tie_projs=tie_projs, init_std=0.5, chunk=chunk, rngs=nnx.Rngs(0),
    )  # fmt: skip


def _params(vocab) -> dict:
    """Every parameter as a float64 numpy array, by name, with biases made non-zero."""
    out = {}
    for name, value in vars(vocab).items():
        if isinstance(value, nnx.Param):
            array = np.asarray(value[...], np.float64)
            if "bias" in name:
                array = np.linspace(-1.0, 1.0, array.size)
            out[name] = array
    return out


def _set(vocab, params):
    for name, array in params.items():
        getattr(vocab, name)[...] = jnp.asarray(array, jnp.float32)


def _reference_log_probs(p, h, div_val, tie_weight, tie_projs) -> np.ndarray:
    """``[N, V]`` from the formulas, one word at a time, in float64."""
    bounds = [0, *CUTOFFS, V]

    def table(i, output):
        name = "out" if output and not tie_weight else "embed"
        if div_val == 1:
            return p[f"{name}_0"][bounds[i] : bounds[i + 1]]
        return p[f"{name}_{i}"]

    def proj(i):
        if div_val == 1 and "proj_0" not in p:
            return np.eye(D)
        if tie_projs[i]:
            return p[f"proj_{0 if div_val == 1 else i}"]
        return p[f"out_proj_{i}"]

    def log_softmax(x):
        return x - np.log(np.exp(x - x.max()).sum()) - x.max()

    out = np.zeros((h.shape[0], V))
    for n in range(h.shape[0]):
        head = np.concatenate([table(0, True), p["cluster_weight"]]) @ (h[n] @ proj(0))
        head = log_softmax(head + np.concatenate([p["bias_0"], p["cluster_bias"]]))
        for w in range(V):
            i = max(c for c in range(len(bounds) - 1) if bounds[c] <= w)
            if i == 0:
                out[n, w] = head[w]
                continue
            tail = log_softmax(table(i, True) @ (h[n] @ proj(i)) + p[f"bias_{i}"])
            cluster_row = len(CUTOFFS) - i  # the official order: cluster i is head column −i
            out[n, w] = head[CUTOFFS[0] + cluster_row] + tail[w - bounds[i]]
    return out


CASES = {
    "one table": dict(div_val=1, d_embed=D),
    "one table, projected": dict(div_val=1),
    "one table, untied": dict(div_val=1, tie_weight=False),
    "div_val 2, tied projections but the first": dict(
        div_val=2, tie_projs=(False, True, True, True)
    ),
    "div_val 2, untied": dict(div_val=2, tie_weight=False),
}


@pytest.mark.parametrize("case", CASES)
def test_log_probs_and_the_loss_equal_the_reference(case, x64):
    kwargs = CASES[case]
    vocab = _vocab(**kwargs)
    params = _params(vocab)
    _set(vocab, params)
    tie_projs = kwargs.get("tie_projs") or (False,) * 4
    h = np.random.default_rng(1).normal(size=(7, D))
    expected = _reference_log_probs(
        params, h, kwargs["div_val"], kwargs.get("tie_weight", True), tie_projs
    )
    np.testing.assert_allclose(np.exp(expected).sum(-1), 1.0, rtol=1e-12)  # a distribution
    full = np.asarray(vocab.log_probs(jnp.asarray(h, jnp.float32)))
    np.testing.assert_allclose(full, expected, atol=2e-5)
    targets = np.array([0, 4, 5, 10, 11, 16, 22])  # both ends of every cluster
    got = vocab.log_prob(jnp.asarray(h, jnp.float32), jnp.asarray(targets))
    np.testing.assert_allclose(got, expected[np.arange(7), targets], atol=2e-5)


@pytest.mark.parametrize("case", ["one table, untied", "div_val 2, tied projections but the first"])
def test_gradients_equal_the_float64_reference_in_chunks(case, x64):
    """Chunks of 3 positions (7 positions: one chunk padded), the backward recomputing each."""
    kwargs = CASES[case]
    vocab = _vocab(**kwargs, chunk=3)
    _set(vocab, _params(vocab))
    h = jnp.asarray(np.random.default_rng(2).normal(size=(7, D)))
    targets = jnp.asarray([1, 6, 12, 18, 22, 3, 9])

    def loss(vocab, h):
        return -vocab.log_prob(h, targets).mean()

    def reference(vocab, h):  # the whole [N, V] table at once, no chunks
        return -jnp.take_along_axis(vocab.log_probs(h), targets[:, None], 1).mean()

    with jax.enable_x64(True):
        wide = jax.tree.map(lambda x: x.astype(jnp.float64), nnx.state(vocab))
        nnx.update(vocab, wide)
        ref_params, ref_h = nnx.grad(reference, argnums=(0, 1))(vocab, h.astype(jnp.float64))
    narrow = jax.tree.map(lambda x: x.astype(jnp.float32), nnx.state(vocab))
    nnx.update(vocab, narrow)
    got_params, got_h = nnx.jit(nnx.grad(loss, argnums=(0, 1)))(vocab, h.astype(jnp.float32))
    np.testing.assert_allclose(got_h, ref_h, rtol=1e-4, atol=1e-6)
    flat_ref = jax.tree_util.tree_flatten_with_path(ref_params)[0]
    flat_got = jax.tree_util.tree_flatten_with_path(got_params)[0]
    for (path, ref), (_, got) in zip(flat_ref, flat_got, strict=True):
        name = jax.tree_util.keystr(path)
        np.testing.assert_allclose(got, ref, rtol=1e-4, atol=1e-6, err_msg=name)
        if any(part in name for part in ("out", "bias", "cluster")):  # the output side's own
            assert np.abs(np.asarray(ref)).max() > 0, name


@pytest.mark.parametrize("div_val", [1, 2])
def test_embedding_is_the_cluster_row_projected_and_scaled(div_val):
    vocab = _vocab(div_val)
    p = _params(vocab)
    tokens = jnp.arange(V)
    got = np.asarray(vocab.embed(tokens))
    bounds = [0, *CUTOFFS, V]
    for w in range(V):
        i = max(c for c in range(4) if bounds[c] <= w)
        if div_val == 1:
            row, proj = p["embed_0"][w], p["proj_0"]
        else:
            row, proj = p[f"embed_{i}"][w - bounds[i]], p[f"proj_{i}"]
        np.testing.assert_allclose(got[w], proj @ row * np.sqrt(D), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        (dict(cutoffs=(5, 5)), "model.cutoffs"),
        (dict(cutoffs=(5, 23)), "model.cutoffs"),
        (dict(cutoffs=(5,), div_val=0), "model.div_val"),
        (dict(cutoffs=(5, 11), div_val=8, d_embed=16), "model.div_val"),
        (dict(cutoffs=(5,), tie_projs=(True,)), "model.tie_projs"),
    ],
)
def test_bad_clusters_are_one_line(kwargs, field):
    cutoffs = kwargs.pop("cutoffs")
    with pytest.raises(ConfigError, match=field) as error:
        AdaptiveVocab(V, D, cutoffs, rngs=nnx.Rngs(0), **kwargs)
    assert "\n" not in str(error.value)


# ------------------------------------------------------------------------------------- the model


def _clustered(**overrides):
    config = dict(
        position="txl", n_layers=1, d_model=32, n_heads=2, d_ff=64, mem_len=8, dropout=0.0,
        cutoffs=(64, 128), div_val=2, tie_projs=(False, True, True),
    )  # fmt: skip
    return TransformerLM({**config, **overrides}, rngs=nnx.Rngs(0))


def test_model_with_clusters_gives_every_byte_a_normalised_log_probability():
    model = _clustered()
    tokens = jax.random.randint(jax.random.key(1), (2, 6), 0, 256)
    assert not hasattr(model, "embed") and not hasattr(model, "head")  # the clusters replace both

    def loss(model):
        out, _ = model(tokens, model.init_mems(2))
        return -jnp.take_along_axis(out, tokens[..., None], -1).mean(), out

    (_, log_probs), grads = nnx.jit(nnx.value_and_grad(loss, has_aux=True))(model)
    assert log_probs.shape == (2, 6, 256)
    np.testing.assert_allclose(jnp.exp(log_probs).sum(-1), 1.0, rtol=1e-5)
    for name in ("embed_0", "embed_2", "proj_1", "out_proj_0", "bias_2", "cluster_weight"):
        assert float(jnp.abs(grads["vocab"][name][...]).max()) > 0, name  # input and output


@pytest.mark.parametrize("clusters", [True, False])
def test_target_log_probs_are_the_log_softmax_of_the_logits_at_the_targets(clusters):
    """What the training loss reads: with clusters computed without the [B, T, V] table."""
    model = _clustered() if clusters else _clustered(cutoffs=(), div_val=1, tie_projs=())
    tokens = jax.random.randint(jax.random.key(2), (2, 7), 0, 256)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    @nnx.jit
    def both(model):
        mems = model.init_mems(2)
        return model.target_log_probs(inputs, targets, mems), model(inputs, mems)

    (log_p, mems_a), (logits, mems_b) = both(model)
    expected = jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1)[..., 0]
    np.testing.assert_allclose(log_p, expected, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(mems_a.states, mems_b.states)


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        (dict(cutoffs=(), tie_projs=()), "model.cutoffs"),  # div_val 2 without clusters
        (dict(cutoffs=(64, 300)), "model.cutoffs"),
        (dict(tie_projs=(True,)), "model.tie_projs"),
        (dict(d_embed=0), "model.d_embed"),
    ],
)
def test_bad_cluster_settings_of_the_model_are_one_line(overrides, field):
    with pytest.raises(ConfigError, match=field) as error:
        _clustered(**overrides)
    assert "\n" not in str(error.value)


@pytest.mark.slow
def test_a_clustered_run_trains_checkpoints_and_resumes(tiny, tmp_path):
    config, _ = tiny
    config = config.copy_and_resolve_references()
    config.model.update(cutoffs=(32, 128), div_val=2)
    config.train.update(steps=4, eval_every=0, ckpt_every=2)
    summary = Trainer(config, tmp_path / "run").run()
    assert np.isfinite(summary["valid_bpc"]), summary
    config.train.steps = 6
    resumed = Trainer(config, tmp_path / "run")
    assert resumed.resumed_from == 4
