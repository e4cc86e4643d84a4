"""HuggingFace ``transfo-xl`` (``TransfoXLLMHeadModel``, e.g. ``transfo-xl-wt103``) -> relpos_jax.

A model folder holds ``config.json`` and the weights, ``model.safetensors`` (read without torch) or
``pytorch_model.bin`` (a torch state dict). torch ``Linear`` weights are ``[out, in]``; ours are
``[in, out]`` with the heads split out (N heads, H head dim, D model, F feed-forward):

    transformer.layers.l.dec_attn.qkv_net.weight [3·N·H, D]  -> ᵀ, [D, 3, N, H]: w_q = [:, 0],
                                                                 w_kv = [:, 1:] ([D, 2, N, H])
    …dec_attn.r_net.weight [N·H, D]   -> position/w_r [D, N, H]       …dec_attn.o_net.weight [D, N·H] -> w_o [N, H, D]
    …dec_attn.layer_norm              -> norm_attention      …pos_ff.layer_norm -> norm_feed_forward
    …pos_ff.CoreNet.0 / .3            -> feed_forward.up / .down (kernel = weightᵀ, bias)
    r_w_bias, r_r_bias [N, H]         -> position/u, v (per layer with txl.untie_r, else the model's)
    word_emb.emb_layers.i / emb_projs.i          -> vocab.embed_i / proj_i (same layout)
    crit.out_layers.i.bias (div_val 1: rows of out_layers.0) -> vocab.bias_i
    crit.out_layers.i.weight (untied), crit.out_projs.i (where not tie_projs[i]) -> out_i, out_proj_i
    crit.cluster_weight / cluster_bias [C, …] -> vocab.cluster_weight / cluster_bias, rows REVERSED

The reversal: the released weights come from the official TensorFlow code, which scores tail
cluster i with head column ``V_0 + i − 1`` (cluster row i − 1), as HuggingFace's
``ProjectedAdaptiveLogSoftmax.forward`` does; ``AdaptiveVocab`` follows the official PyTorch code,
which reads column −i (row C − i). Reversing the C rows makes the two the same function.

Both HuggingFace and the official code scale embeddings by √d_model, use the sinusoid
cat[sin, cos] of distances klen − 1 … 0 capped at clamp_len (≤ 0: none), post-norm layers with
LayerNorm ε 1e-5 — as relpos_jax does. Not convertible exactly, and refused: ``pre_lnorm`` (neither
has a final norm, relpos_jax's pre-norm model has), ``attn_type`` ≠ 0, ``sample_softmax`` > 0,
another ``layer_norm_epsilon``. Without cutoffs the tied output layer's bias becomes
``output_bias`` (``model.output_bias=True``).

HuggingFace starts a stream with ``mem_len`` zero states that are attended to, as the TensorFlow
code did for the paper's numbers; relpos_jax starts with an empty memory, as the official PyTorch
code (``Memory(zeros, valid=mem_len)`` gives the other). ``same_length`` masks one key more in
HuggingFace (and the official PyTorch code) than in TensorFlow and relpos_jax.
"""

from __future__ import annotations

import itertools
import json
import pathlib
from typing import Any

import ml_collections
import numpy as np

from relpos_jax.config import Config, defaults
from relpos_jax.convert import common, plain_pickle
from relpos_jax.convert.common import ConvertError, Tensors

WEIGHTS = ("model.safetensors", "pytorch_model.bin")
VOCABS = ("vocab.pkl", "vocab.bin")
FIX = "pass the folder that save_pretrained wrote (its config.json and weights belong together)"


def read_config(folder: pathlib.Path) -> dict[str, Any]:
    """``config.json`` of a transfo-xl model folder."""
    if not folder.is_dir():
        raise ConvertError(
            f"--source={str(folder)!r} is not a folder; pass the folder of a HuggingFace "
            f"transfo-xl model (config.json and {' or '.join(WEIGHTS)})"
        )
    path = folder / "config.json"
    if not path.is_file():
        raise ConvertError(
            f"{folder} has no config.json; pass the folder of a HuggingFace transfo-xl model"
        )
    try:
        hf = json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise ConvertError(f"{path} is not JSON ({error}); {FIX}") from None
    if not isinstance(hf, dict):
        raise ConvertError(f"{path} holds {type(hf).__name__}, not an object of fields; {FIX}")
    if hf.get("model_type", "transfo-xl") != "transfo-xl":
        raise ConvertError(
            f"{path} has model_type={hf['model_type']!r}; pass a transfo-xl model folder"
        )
    return hf


def model_fields(hf: dict[str, Any]) -> dict[str, Any]:
    """relpos_jax ``model.*`` fields from a transfo-xl ``config.json``; refuses what relpos_jax
    does not compute the same way."""
    where = "config.json"
    attn_type = _json(hf, "attn_type", int, 0)
    sample_softmax = _json(hf, "sample_softmax", int, -1)
    pre_lnorm = _json(hf, "pre_lnorm", bool, False)
    epsilon = _json(hf, "layer_norm_epsilon", float, 1e-5)
    refuse = {
        "attn_type": (attn_type != 0, "only attention type 0 (relative) is released"),
        "sample_softmax": (sample_softmax > 0, "sampled softmax is not supported"),
        "pre_lnorm": (pre_lnorm, "relpos_jax's pre-norm model adds a final norm"),
        "layer_norm_epsilon": (abs(epsilon - 1e-5) > 1e-12, "relpos_jax's layer norms use 1e-5"),
    }
    for key, (bad, why) in refuse.items():
        if bad:
            raise ConvertError(f"{where} has {key}={hf[key]!r}, which cannot be converted: {why}")
    vocab_key = "vocab_size" if "vocab_size" in hf or "n_token" not in hf else "n_token"
    cutoffs = tuple(_json(hf, "cutoffs", [int], []))
    tie_projs = _json(hf, "tie_projs", [bool], None)
    if tie_projs is None:  # older files: the flag that configuration_transfo_xl expands
        share = _json(hf, "proj_share_all_but_first", bool, True)
        tie_projs = [False] + [share] * len(cutoffs)
    clamp = _json(hf, "clamp_len", int, -1)
    tie_weight = _json(hf, "tie_weight", bool, True)
    fields = dict(
        position="txl",
        vocab_size=_json(hf, vocab_key, int),
        n_layers=_json(hf, "n_layer", int),
        d_model=_json(hf, "d_model", int),
        n_heads=_json(hf, "n_head", int),
        d_head=_json(hf, "d_head", int),
        d_ff=_json(hf, "d_inner", int),
        dropout=0.0,
        dropatt=0.0,
        mem_len=_json(hf, "mem_len", int, 0),
        same_length=_json(hf, "same_length", bool, False),
        clamp_len=clamp if clamp > 0 else None,
        txl={"untie_r": _json(hf, "untie_r", bool, True)},
        pre_norm=False,
        tie_embeddings=_json(hf, "tie_word_embeddings", bool, tie_weight),
        cutoffs=cutoffs,
    )
    d_embed = _json(hf, "d_embed", int, fields["d_model"])
    div_val = _json(hf, "div_val", int, 1)
    if cutoffs:
        fields.update(div_val=div_val, d_embed=d_embed, tie_projs=tuple(tie_projs))
    elif d_embed != fields["d_model"] or div_val != 1:
        raise ConvertError(
            f"{where} has no cutoffs but d_embed={d_embed} (or div_val) unlike d_model: "
            "relpos_jax projects embeddings only with cutoffs"
        )
    else:  # one plain softmax (with its bias): none of a base config's cluster settings apply
        fields.update(div_val=1, d_embed=None, tie_projs=(), output_bias=fields["tie_embeddings"])
    return fields


_REQUIRED = object()
_KINDS = {int: "an integer", bool: "true or false", float: "a number"}
_PLURAL = {int: "integers", bool: "booleans (true or false)"}


def _json(hf: dict[str, Any], key: str, kind: Any, default: Any = _REQUIRED) -> Any:
    """``hf[key]``, which must be of JSON type ``kind`` (int, bool, float; ``[int]``: a list of
    them), or ``default`` when absent (no default: required). Nothing is coerced: 2.5 is not an
    integer and "yes" is not true."""
    if key not in hf:
        if default is _REQUIRED:
            raise ConvertError(f"config.json has no {key!r}; {FIX}")
        return default
    value = hf[key]

    def fits(x: Any, kind: Any) -> bool:
        if kind is bool:
            return isinstance(x, bool)
        number = isinstance(x, int | float) if kind is float else isinstance(x, int)
        return number and not isinstance(x, bool)

    if isinstance(kind, list):
        ok = isinstance(value, list) and all(fits(x, kind[0]) for x in value)
        what = f"a list of {_PLURAL[kind[0]]}"
    else:
        ok, what = fits(value, kind), _KINDS[kind]
    if not ok:
        raise ConvertError(f"config.json has {key}={value!r}, which is not {what}; {FIX}")
    return value


def read_tensors(folder: pathlib.Path) -> Tensors:
    """The weights of ``folder``: ``model.safetensors`` if present, else ``pytorch_model.bin``."""
    for name in WEIGHTS:
        path = folder / name
        if path.is_file():
            break
    else:
        raise ConvertError(
            f"{folder} has neither {' nor '.join(WEIGHTS)}; pass the folder that save_pretrained "
            "or the model download wrote"
        )
    if path.suffix == ".safetensors":
        safetensors = common.need("safetensors.numpy", f"reading {path}")
        try:
            arrays = safetensors.load_file(str(path))
        except Exception as error:  # truncated, garbled, a dtype numpy lacks
            raise ConvertError(
                f"{path} cannot be read as safetensors ({common.first_line(error)}); {FIX}"
            ) from None
    else:
        torch = common.need("torch", f"reading {path}")
        try:
            state = torch.load(str(path), map_location="cpu", weights_only=True)
        except Exception as error:  # truncated, garbled, an object weights_only does not build
            raise ConvertError(
                f"{path} cannot be read by torch.load ({common.first_line(error)}); {FIX}"
            ) from None
        if not isinstance(state, dict):
            raise ConvertError(
                f"{path} holds a {type(state).__name__}, not a state dict of named tensors; {FIX}"
            )
        arrays = {  # floating point as float32 (numpy has no bfloat16); others as they are
            k: (v.detach().float() if v.is_floating_point() else v.detach()).numpy()
            for k, v in state.items()
            if isinstance(v, torch.Tensor)
        }
    shapes = {name: tuple(array.shape) for name, array in arrays.items()}
    return Tensors(str(path), shapes, arrays.__getitem__, FIX)


def _layers(model: dict, src: Tensors, out: dict) -> None:
    d, n, h, f = model["d_model"], model["n_heads"], model["d_head"], model["d_ff"]
    heads, widths = "config.json n_head, d_head, d_model", "config.json d_model, d_inner"
    for layer in range(model["n_layers"]):
        pre, ours = f"transformer.layers.{layer}.", f"blocks/{layer}/"
        qkv = src.get(pre + "dec_attn.qkv_net.weight", (3 * n * h, d), heads)
        qkv = qkv.T.reshape(d, 3, n, h)
        out[ours + "attention/w_q"], out[ours + "attention/w_kv"] = qkv[:, 0], qkv[:, 1:]
        r = src.get(pre + "dec_attn.r_net.weight", (n * h, d), heads)
        out[ours + "attention/position/w_r"] = r.T.reshape(d, n, h)
        o = src.get(pre + "dec_attn.o_net.weight", (d, n * h), heads)
        out[ours + "attention/w_o"] = o.T.reshape(n, h, d)
        norms = (
            ("dec_attn.layer_norm", "norm_attention"),
            ("pos_ff.layer_norm", "norm_feed_forward"),
        )
        for theirs, norm in norms:
            out[ours + f"{norm}/scale"] = src.get(pre + theirs + ".weight", (d,), widths)
            out[ours + f"{norm}/bias"] = src.get(pre + theirs + ".bias", (d,), widths)
        for theirs, dense, shape in (("0", "up", (f, d)), ("3", "down", (d, f))):
            weight = src.get(pre + f"pos_ff.CoreNet.{theirs}.weight", shape, widths)
            out[ours + f"feed_forward/{dense}/kernel"] = weight.T
            out[ours + f"feed_forward/{dense}/bias"] = src.get(
                pre + f"pos_ff.CoreNet.{theirs}.bias", shape[:1], widths
            )
        if model["txl"]["untie_r"]:
            out[ours + "attention/position/u"] = src.get(pre + "dec_attn.r_w_bias", (n, h), heads)
            out[ours + "attention/position/v"] = src.get(pre + "dec_attn.r_r_bias", (n, h), heads)
    if not model["txl"]["untie_r"]:
        out["position/u"] = src.get("transformer.r_w_bias", (n, h), heads + ", untie_r")
        out["position/v"] = src.get("transformer.r_r_bias", (n, h), heads + ", untie_r")


def _vocab(model: dict, src: Tensors, out: dict) -> None:
    """The adaptive embedding and softmax."""
    d, vocab, cutoffs = model["d_model"], model["vocab_size"], model["cutoffs"]
    bounds = (0, *cutoffs, vocab)
    sizes = [b - a for a, b in itertools.pairwise(bounds)]
    emb, crit = "transformer.word_emb.", "crit."
    why = "config.json vocab_size, cutoffs, d_embed, div_val, d_model"
    tied = model["tie_embeddings"]
    if not cutoffs:
        out["embed/embedding"] = src.get(emb + "emb_layers.0.weight", (vocab, d), why)
        bias = src.get(crit + "out_layers.0.bias", (vocab,), why)
        if tied:
            out["output_bias"] = bias
        else:
            out["head/kernel"] = src.get(crit + "out_layers.0.weight", (vocab, d), why).T
            out["head/bias"] = bias
        return
    div_val, d_embed, tie_projs = model["div_val"], model["d_embed"], model["tie_projs"]
    tables = [(vocab, d_embed)] if div_val == 1 else list(zip(sizes, _widths(model), strict=True))
    for i, shape in enumerate(tables):
        out[f"vocab/embed_{i}"] = src.get(emb + f"emb_layers.{i}.weight", shape, why)
        if not tied:
            out[f"vocab/out_{i}"] = src.get(crit + f"out_layers.{i}.weight", shape, why)
        if _projected(model):
            out[f"vocab/proj_{i}"] = src.get(emb + f"emb_projs.{i}", (d, shape[1]), why)
        bias = src.get(crit + f"out_layers.{i}.bias", shape[:1], why)
        if div_val == 1:  # one bias over the vocabulary: each cluster its rows
            for j, (low, high) in enumerate(itertools.pairwise(bounds)):
                out[f"vocab/bias_{j}"] = bias[low:high]
        else:
            out[f"vocab/bias_{i}"] = bias
    for i, width in enumerate(_widths(model)):
        if _projected(model) and not tie_projs[i]:
            out[f"vocab/out_proj_{i}"] = src.get(crit + f"out_projs.{i}", (d, width), why)
    clusters = len(cutoffs)  # reversed: see the module docstring
    out["vocab/cluster_weight"] = src.get(crit + "cluster_weight", (clusters, d_embed), why)[::-1]
    out["vocab/cluster_bias"] = src.get(crit + "cluster_bias", (clusters,), why)[::-1]


def _widths(model: dict) -> list[int]:
    """Each cluster's embedding width (all d_embed where div_val is 1)."""
    clusters = len(model["cutoffs"]) + 1
    return [model["d_embed"] // model["div_val"] ** i for i in range(clusters)]


def _projected(model: dict) -> bool:
    return model["div_val"] > 1 or model["d_embed"] != model["d_model"]


def _copies(model: dict) -> list[tuple[str, str, str]]:
    """(copy, original, why) for the tensors a .bin file may repeat: tied output tables and
    projections, and the per-layer copies of shared u and v."""
    copies = []
    if model["cutoffs"]:
        one_table = model["div_val"] == 1
        for i, tie_proj in enumerate(model["tie_projs"]):
            table = 0 if one_table else i
            if model["tie_embeddings"] and table == i:
                copies.append((
                    f"crit.out_layers.{i}.weight", f"transformer.word_emb.emb_layers.{i}.weight",
                    "tie_word_embeddings is true",
                ))  # fmt: skip
            if tie_proj and _projected(model):
                copies.append((
                    f"crit.out_projs.{i}", f"transformer.word_emb.emb_projs.{table}",
                    f"tie_projs[{i}] is true",
                ))  # fmt: skip
    elif model["tie_embeddings"]:
        copies.append((
            "crit.out_layers.0.weight", "transformer.word_emb.emb_layers.0.weight",
            "tie_word_embeddings is true",
        ))  # fmt: skip
    if not model["txl"]["untie_r"]:
        for layer in range(model["n_layers"]):
            for name in ("r_w_bias", "r_r_bias"):
                copies.append((
                    f"transformer.layers.{layer}.dec_attn.{name}", f"transformer.{name}",
                    "untie_r is false",
                ))  # fmt: skip
    return copies


def convert_params(model: dict[str, Any], src: Tensors) -> dict[str, np.ndarray]:
    """relpos_jax parameters (``"path": array``) from the tensors of a transfo-xl folder, whose
    config.json gave the relpos_jax model fields ``model``. Tensors that a tie makes copies of
    another must equal it; any other tensor left unused is refused."""
    out: dict[str, np.ndarray] = {}
    _layers(model, src, out)
    _vocab(model, src, out)
    for copy, original, why in _copies(model):
        if src.has(copy) and src.has(original):
            same = src.shapes[copy] == src.shapes[original]
            if not (same and np.array_equal(src.read(copy), src.read(original))):
                raise ConvertError(
                    f"{copy} differs from {original} in {src.where}, but config.json says {why}; "
                    f"{FIX}"
                )
            src.used.add(copy)
    unused = src.unused(lambda name: name == "transformer.pos_emb.inv_freq")
    if unused:
        raise ConvertError(
            f"{src.where} holds {common.listed(unused)} that config.json does not use; {FIX}"
        )
    return out


def read_vocab(folder: pathlib.Path) -> list[str] | None:
    """The tokenizer's symbols (``idx2sym``) from ``vocab.pkl`` / ``vocab.bin``, or None. A pickle is
    read as plain data (``plain_pickle``: nothing in it runs; anything but containers, strings and
    numbers is refused in one line), a ``torch.save`` file by ``torch.load(weights_only=True)``."""
    for name in VOCABS:
        path = folder / name
        if not path.is_file():
            continue
        if path.read_bytes()[:4] == b"PK\x03\x04":  # a torch.save zip archive
            torch = common.need("torch", f"reading {path}")
            try:
                loaded = torch.load(str(path), weights_only=True)
            except Exception as error:
                raise ConvertError(
                    f"{path} cannot be read by torch.load(weights_only=True) "
                    f"({common.first_line(error)}); move it out of --source"
                ) from None
        else:
            try:
                loaded = plain_pickle.load(path)
            except plain_pickle.RefusedPickle as error:
                raise ConvertError(
                    f"{path} is refused: it would call {error} when read, and a vocabulary holds "
                    "only lists, dicts and strings; move it out of --source"
                ) from None
            except Exception as error:
                raise ConvertError(
                    f"{path} is not a readable pickle ({common.first_line(error)}); move it out of --source"
                ) from None
        if not isinstance(loaded, dict) or "idx2sym" not in loaded:
            raise ConvertError(f"{path} holds no idx2sym list; move it out of --source")
        return [str(symbol) for symbol in loaded["idx2sym"]]
    return None


def convert(source, workdir, base_config: ml_collections.ConfigDict | None = None) -> dict:
    """Convert the transfo-xl folder ``source`` into the run directory ``workdir``.

    ``base_config`` (a ConfigDict, e.g. ``load_config("configs/txl_large_wt103.py")``) supplies
    the sections other than the model's (data, eval, …; default: configs/base.py's) and the
    model's runtime fields (dtype, attention_impl); config.json sets every other model field.
    Returns ``config`` (the written file's path), ``vocab`` (``vocab.txt``'s path, or None),
    ``config_object`` (the validated Config) and ``model`` (the TransformerLM). With a
    vocabulary, the config's ``data.vocab`` names ``vocab.txt``, so that a word-level corpus is
    read with the model's ids."""
    folder = pathlib.Path(source)
    hf = read_config(folder)
    fields = model_fields(hf)
    config = (base_config or defaults()).to_dict()
    config["model"] = {**config.get("model", {}), **fields}
    symbols = read_vocab(folder)
    if symbols is not None:  # word-level data then reads with the model's own ids
        config["data"]["vocab"] = str((pathlib.Path(workdir) / "vocab.txt").resolve())
    cfg = Config.from_any(config)
    src = read_tensors(folder)
    params = convert_params(fields, src)
    lm = common.assemble(cfg.model, params)
    if symbols is not None and len(symbols) != cfg.model.vocab_size:
        raise ConvertError(
            f"{folder} has a vocabulary of {len(symbols)} symbols but vocab_size="
            f"{cfg.model.vocab_size}; move the vocabulary file out of --source"
        )
    vocab_text = None if symbols is None else common.vocab_text(symbols)
    header = (
        f"Converted from the HuggingFace transfo-xl model in {folder.resolve()} by "
        "python -m relpos_jax.convert huggingface.\n\nThe model fields come from its config.json; "
        "evaluate with python eval.py --config <this file> --workdir <its folder>."
    )
    path = common.write_run(cfg, lm, workdir, header=header)
    vocab_path = None
    if vocab_text is not None:
        vocab_path = pathlib.Path(workdir) / "vocab.txt"
        vocab_path.write_text(vocab_text, encoding="utf-8")
    return {"config": path, "vocab": vocab_path, "config_object": cfg, "model": lm}
