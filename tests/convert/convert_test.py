"""relpos_jax.convert: released Transformer-XL weights give the same log-probabilities here.

A randomly initialised HuggingFace ``TransfoXLLMHeadModel`` (adaptive input and softmax, every
parameter drawn from a normal, biases included) is saved with ``save_pretrained``, converted, and
run over three consecutive segments with memory: every word's log-probability equals
HuggingFace's ``prediction_scores``. The same weights written as an official TensorFlow checkpoint
(the variable names of kimiyoung/transformer-xl ``tf/model.py``) convert to the same parameters,
leaf for leaf. The converted run directory is restored by ``evaluate.restore_model``.

These tests need the ``convert`` extra (torch, transformers, TensorFlow), which ``make test`` and
CI do not install: ``make test-convert`` sets up ``.venv-convert`` and runs them. The error tests
that need none of it run everywhere.
"""

from __future__ import annotations

import pickle
import subprocess
import sys
import types
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from relpos_jax import load_config
from relpos_jax.convert import ConvertError, common, huggingface, tensorflow
from relpos_jax.memory import Memory
from relpos_jax.sharding import path_string
from tests.helpers import ROOT

B, T, S = 2, 8, 3  # batch, segment, segments
TOL = dict(rtol=1e-5, atol=1e-5)
EXTRA = "needs the convert extra (torch, transformers, tensorflow): make test-convert"
SMALL = dict(
    vocab_size=300, cutoffs=[50, 100, 200], div_val=2, d_model=32, d_embed=32, n_layer=2,
    n_head=4, d_head=8, d_inner=64, mem_len=8, clamp_len=-1, same_length=False, untie_r=True,
    dropout=0.0, dropatt=0.0,
)  # fmt: skip
VARIANTS = {  # (HuggingFace config, save as safetensors)
    "div_val 2, untie_r": (SMALL, True),
    # one table projected from d_embed 16; shared u/v, which safetensors cannot save: a .bin
    "div_val 1, shared u/v, clamp_len": (
        dict(SMALL, div_val=1, d_embed=16, untie_r=False, clamp_len=5),
        False,
    ),
    "untied tables and projections": (
        dict(SMALL, tie_word_embeddings=False, proj_share_all_but_first=False),
        True,
    ),
    "no clusters, untied output layer": (
        dict(SMALL, cutoffs=[], div_val=1, tie_word_embeddings=False),
        True,
    ),
    # enwik8's and text8's models: a tied softmax whose bias becomes model.output_bias
    "no clusters, tied output layer and its bias": (dict(SMALL, cutoffs=[], div_val=1), True),
}
TIED = [name for name, (cfg, _) in VARIANTS.items() if cfg.get("tie_word_embeddings", True)]


@pytest.fixture(scope="module")
def hf():
    torch = pytest.importorskip("torch", reason=EXTRA)
    pytest.importorskip("transformers", reason=EXTRA)
    from transformers.models.deprecated.transfo_xl import TransfoXLConfig, TransfoXLLMHeadModel

    # transformers' deprecated TransfoXLModel.forward calls Tensor.type_as(dtype=...), which
    # current torch refuses (type_as takes a tensor): give it that keyword, meaning .to(dtype).
    type_as = torch.Tensor.type_as

    def type_as_with_dtype(self, other=None, *, dtype=None):
        return self.to(dtype) if other is None else type_as(self, other)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(torch.Tensor, "type_as", type_as_with_dtype)
        yield types.SimpleNamespace(torch=torch, Config=TransfoXLConfig, Model=TransfoXLLMHeadModel)


def _hf_model(hf, settings: dict, seed: int = 0):
    """A TransfoXLLMHeadModel with every parameter random: not HuggingFace's init, whose biases
    and cluster parameters start at zero and would hide a misplaced bias or cluster row."""
    torch = hf.torch
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model = hf.Model(hf.Config(**settings)).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():  # tied parameters appear once
            noise = torch.randn(param.shape, generator=generator)
            param.copy_(1 + 0.1 * noise if "layer_norm.weight" in name else 0.15 * noise)
    return model


def _hf_log_probs(hf, model, tokens: np.ndarray, mems=None) -> np.ndarray:
    """HuggingFace over S segments with memory. Its ``init_mems`` fills the memory with mem_len
    zero states that are attended to (as the TensorFlow code did); the official PyTorch code, and
    relpos_jax, start with an empty memory: HuggingFace gets that explicitly (length 0)."""
    torch, config = hf.torch, model.config
    if mems is None:
        mems = [torch.zeros(0, tokens.shape[0], config.d_model) for _ in range(config.n_layer)]
    outputs = []
    with torch.no_grad():
        for s in range(S):
            out = model(input_ids=torch.as_tensor(tokens[:, s * T : (s + 1) * T]), mems=mems)
            outputs.append(out.prediction_scores.numpy())
            mems = out.mems
    return np.concatenate(outputs, axis=1)


def _our_log_probs(model, tokens: np.ndarray, mems=None) -> np.ndarray:
    mems = model.init_mems(tokens.shape[0]) if mems is None else mems
    outputs = []
    for s in range(S):
        logits, mems = model(jnp.asarray(tokens[:, s * T : (s + 1) * T]), mems)
        outputs.append(np.asarray(jax.nn.log_softmax(logits)))  # with clusters: already are
    return np.concatenate(outputs, axis=1)


def _tokens(vocab: int = 300, seed: int = 1) -> np.ndarray:
    """Every cluster, both ends of each, in every segment."""
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, vocab, (B, S * T))
    tokens[0, :T] = [0, 49, 50, 99, 100, 199, 200, 299]
    return tokens


def _saved(hf, tmp_path, variant: str, *, vocab: bool = False):
    settings, safetensors = VARIANTS[variant]
    model = _hf_model(hf, settings)
    folder = tmp_path / "hf"
    model.save_pretrained(folder, safe_serialization=safetensors)
    if vocab:
        symbols = ["<eos>", *(f"w{i}" for i in range(1, settings["vocab_size"]))]
        (folder / "vocab.pkl").write_bytes(pickle.dumps({"idx2sym": symbols}))
    return model, folder


def _params(model) -> dict[str, np.ndarray]:
    leaves = jax.tree_util.tree_leaves_with_path(nnx.state(model, nnx.Param))
    return {path_string(path): np.asarray(leaf) for path, leaf in leaves}


# --------------------------------------------------------------------------- HuggingFace route


@pytest.mark.parametrize("variant", VARIANTS)
def test_huggingface_log_probs_equal_over_segments_with_memory(hf, tmp_path, variant):
    model, folder = _saved(hf, tmp_path, variant)
    written = huggingface.convert(folder, tmp_path / "run")
    tokens = _tokens()
    ours = _our_log_probs(written["model"], tokens)
    theirs = _hf_log_probs(hf, model, tokens)
    assert ours.shape == theirs.shape == (B, S * T, 300)
    print(f"{variant}: max |Δ log p| = {np.abs(ours - theirs).max():.2e}")
    np.testing.assert_allclose(ours, theirs, **TOL)


def test_huggingface_zero_memory_is_every_slot_valid(hf, tmp_path):
    """HuggingFace's default first memory (mem_len zero states, attended to) is relpos_jax's
    memory of zeros with every slot marked valid."""
    model, folder = _saved(hf, tmp_path, "div_val 2, untie_r")
    lm = huggingface.convert(folder, tmp_path / "run")["model"]
    tokens = _tokens()
    zeros = Memory(jnp.zeros((2, B, 8, 32)), jnp.asarray(8, jnp.int32))
    ours = _our_log_probs(lm, tokens, zeros)
    theirs = _hf_log_probs(hf, model, tokens, mems=model.init_mems(B))
    np.testing.assert_allclose(ours, theirs, **TOL)
    assert np.abs(ours - _our_log_probs(lm, tokens)).max() > 1e-3  # the zeros do matter


@pytest.mark.parametrize("variant", ["div_val 2, untie_r", "div_val 1, shared u/v, clamp_len"])
def test_converted_workdir_is_restored_by_evaluate(hf, tmp_path, variant):
    from relpos_jax.evaluate import restore_model

    model, folder = _saved(hf, tmp_path, variant)
    workdir = tmp_path / "run"
    written = huggingface.convert(folder, workdir)
    restored, config, step = restore_model(load_config(written["config"]), workdir)
    assert step == 0 and config.model == written["config_object"].model
    tokens = _tokens()
    theirs = _hf_log_probs(hf, model, tokens)
    np.testing.assert_allclose(_our_log_probs(restored, tokens), theirs, **TOL)
    # evaluation's memory of projected keys and values (evaluate.score_segments) as well
    kv = restored.init_mems(B, keys_values=True)
    np.testing.assert_allclose(_our_log_probs(restored, tokens, kv), theirs, **TOL)


def test_cli_writes_the_run_and_the_vocabulary(hf, tmp_path):
    _, folder = _saved(hf, tmp_path, "div_val 2, untie_r", vocab=True)
    workdir = tmp_path / "run"
    base = ROOT / "configs" / "txl_small.py"  # keeps its sections but the model's
    done = _cli("huggingface", "--source", folder, "--workdir", workdir, "--config", base)
    assert done.returncode == 0, done.stderr
    written = load_config(workdir / "config.py")
    assert written.train.lr == load_config(base).train.lr and written.model.vocab_size == 300
    assert "vocabulary:" in done.stdout and "evaluate: python eval.py" in done.stdout
    lines = (workdir / "vocab.txt").read_text().splitlines()
    assert len(lines) == 300 and lines[0] == "<eos>" and lines[299] == "w299"
    assert written.data.vocab == str((workdir / "vocab.txt").resolve())  # word-level data: its ids
    assert (workdir / "checkpoints" / "0").is_dir() and (workdir / "config.py").is_file()
    again = _cli("huggingface", "--source", folder, "--workdir", workdir)
    assert again.returncode == 2 and "already holds a checkpoint" in _one_line(again.stderr)


def test_huggingface_wrong_shape_names_the_tensor_and_config(hf, tmp_path):
    _, folder = _saved(hf, tmp_path, "div_val 2, untie_r")
    config = (folder / "config.json").read_text().replace('"d_inner": 64', '"d_inner": 128')
    (folder / "config.json").write_text(config)
    with pytest.raises(ConvertError) as error:
        huggingface.convert(folder, tmp_path / "run")
    message = _one_line(str(error.value))
    assert "transformer.layers.0.pos_ff.CoreNet.0.weight has shape (64, 32)" in message
    assert "d_inner" in message and "(128, 32)" in message


# ---------------------------------------------------------------------------- TensorFlow route


def _tf_variables(model) -> dict[str, np.ndarray]:
    """The HuggingFace weights under the official TensorFlow names and layouts (``tf/model.py``;
    kernels and projections transposed, as HuggingFace's TF -> PyTorch converter reads them;
    r_w_bias stacked per layer with untie_r). Plus a step counter and an Adam slot, which a
    training checkpoint holds too."""
    config = model.config
    sd = {k: v.detach().numpy() for k, v in model.state_dict().items()}
    out = {"global_step": np.int64(7)}
    for layer in range(config.n_layer):
        pt, tf_ = f"transformer.layers.{layer}.", f"transformer/layer_{layer}/"
        for theirs, ours in (("qkv", "qkv_net"), ("r", "r_net"), ("o", "o_net")):
            out[tf_ + f"rel_attn/{theirs}/kernel"] = sd[pt + f"dec_attn.{ours}.weight"].T
        for scope, norm in (("rel_attn", "dec_attn.layer_norm"), ("ff", "pos_ff.layer_norm")):
            out[tf_ + f"{scope}/LayerNorm/gamma"] = sd[pt + norm + ".weight"]
            out[tf_ + f"{scope}/LayerNorm/beta"] = sd[pt + norm + ".bias"]
        for theirs, ours in (("layer_1", "0"), ("layer_2", "3")):
            out[tf_ + f"ff/{theirs}/kernel"] = sd[pt + f"pos_ff.CoreNet.{ours}.weight"].T
            out[tf_ + f"ff/{theirs}/bias"] = sd[pt + f"pos_ff.CoreNet.{ours}.bias"]
    for name in ("r_w_bias", "r_r_bias"):
        if config.untie_r:
            per_layer = [
                sd[f"transformer.layers.{i}.dec_attn.{name}"] for i in range(config.n_layer)
            ]
            out[f"transformer/{name}"] = np.stack(per_layer)
        else:
            out[f"transformer/{name}"] = sd[f"transformer.{name}"]
    out["transformer/r_w_bias/Adam"] = np.zeros_like(out["transformer/r_w_bias"])
    embed, softmax = "transformer/adaptive_embed/", "transformer/adaptive_softmax/"
    emb = "transformer.word_emb."
    if not config.cutoffs:  # enwik8, text8: one table, tied, and the softmax's bias
        out[embed + "lookup_table"] = sd[emb + "emb_layers.0.weight"]
        out[softmax + "bias"] = sd["crit.out_layers.0.bias"]
        return out
    bounds = [0, *config.cutoffs, config.vocab_size]
    for i in range(len(bounds) - 1):
        if config.div_val == 1:
            out[softmax + f"cutoff_{i}/b"] = sd["crit.out_layers.0.bias"][bounds[i] : bounds[i + 1]]
        else:
            out[embed + f"cutoff_{i}/lookup_table"] = sd[emb + f"emb_layers.{i}.weight"]
            out[embed + f"cutoff_{i}/proj_W"] = sd[emb + f"emb_projs.{i}"].T
            out[softmax + f"cutoff_{i}/b"] = sd[f"crit.out_layers.{i}.bias"]
        if not config.tie_projs[i]:
            out[softmax + f"cutoff_{i}/proj"] = sd[f"crit.out_projs.{i}"].T
    if config.div_val == 1:
        out[embed + "lookup_table"] = sd[emb + "emb_layers.0.weight"]
        out[embed + "proj_W"] = sd[emb + "emb_projs.0"].T
    out[softmax + "cutoff_0/cluster_W"] = sd["crit.cluster_weight"]  # same order as HuggingFace
    out[softmax + "cutoff_0/cluster_b"] = sd["crit.cluster_bias"]
    return out


def _tf_checkpoint(variables: dict[str, np.ndarray], prefix) -> str:
    """A checkpoint whose variables have exactly these names, as ``tf.train.load_checkpoint``
    (and the official code's Saver) read them."""
    tf = pytest.importorskip("tensorflow", reason=EXTRA)
    saver = tf.compat.v1.train.Saver(
        var_list={name: tf.Variable(value) for name, value in variables.items()}
    )
    return saver.save(None, str(prefix), write_meta_graph=False)


@pytest.mark.parametrize("variant", TIED)
def test_tensorflow_checkpoint_gives_the_huggingface_parameters(hf, tmp_path, variant):
    model, folder = _saved(hf, tmp_path, variant)
    from_hf = huggingface.convert(folder, tmp_path / "hf_run")
    prefix = _tf_checkpoint(_tf_variables(model), tmp_path / "tf" / "model.ckpt-0")
    config = load_config(from_hf["config"])  # the config the HuggingFace route wrote
    from_tf = tensorflow.convert(prefix, config, tmp_path / "tf_run")
    ours, theirs = _params(from_tf["model"]), _params(from_hf["model"])
    assert sorted(ours) == sorted(theirs)
    for name in ours:
        np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)


def _tf_error(hf, tmp_path, drop: str = "", settings=SMALL, **model) -> str:
    """The one-line error of converting SMALL's checkpoint (less ``drop``) under a config with
    the ``model`` fields changed."""
    hf_model = _hf_model(hf, settings)
    variables = _tf_variables(hf_model)
    variables.pop(drop, None)
    prefix = _tf_checkpoint(variables, tmp_path / "tf" / "model.ckpt-0")
    config = load_config(ROOT / "configs" / "base.py")
    fields = huggingface.model_fields(hf_model.config.to_dict())
    config.model.update({**fields, **model})
    with pytest.raises(ConvertError) as error:
        tensorflow.convert(prefix, config, tmp_path / "run")
    return _one_line(str(error.value))


def test_tensorflow_missing_variable_is_one_line(hf, tmp_path):
    message = _tf_error(hf, tmp_path, drop="transformer/layer_1/rel_attn/r/kernel")
    assert "has no tensor 'transformer/layer_1/rel_attn/r/kernel'" in message
    assert "model.n_layers=2" in message and "--config" in message


def test_tensorflow_wrong_shape_names_the_variable_and_field(hf, tmp_path):
    message = _tf_error(hf, tmp_path, d_ff=128)
    assert "transformer/layer_0/ff/LayerNorm" not in message
    assert "transformer/layer_0/ff/layer_1/kernel has shape (32, 64)" in message
    assert "model.d_ff=128 gives (32, 128)" in message


def test_tensorflow_layers_beyond_the_config_are_refused(hf, tmp_path):
    message = _tf_error(hf, tmp_path, n_layers=1)  # untie_r: the stacked [L, N, H] biases
    assert "transformer/r_w_bias has shape (2, 4, 8)" in message and "model.n_layers=1" in message
    message = _tf_error(hf, tmp_path, settings=dict(SMALL, untie_r=False), n_layers=1)
    assert "'transformer/layer_1/ff/LayerNorm/beta' (and 10 more)" in message
    assert "does not use" in message


# ------------------------------------------------------------------ errors that need no extra


def _one_line(text: str) -> str:
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


def _cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "relpos_jax.convert", *map(str, args)],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
    )  # fmt: skip


def test_missing_folder_and_missing_weights_are_one_line(tmp_path):
    done = _cli("huggingface", "--source", tmp_path / "nowhere", "--workdir", tmp_path / "run")
    assert done.returncode == 2
    assert "is not a folder" in _one_line(done.stderr)
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text('{"model_type": "transfo-xl"}')
    with pytest.raises(ConvertError, match=r"has neither model.safetensors nor pytorch_model.bin"):
        huggingface.read_tensors(tmp_path / "hf")
    with pytest.raises(ConvertError, match=r"is not a TensorFlow checkpoint|not installed"):
        tensorflow.open_checkpoint(tmp_path / "model.ckpt-0")


def test_a_missing_package_names_the_extra():
    with pytest.raises(ConvertError) as error:
        common.need("no_such_package_for_relpos", "reading a checkpoint")
    assert "[convert]" in _one_line(str(error.value))
