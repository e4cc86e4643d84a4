"""The official TensorFlow checkpoints (kimiyoung/transformer-xl ``tf/``) -> relpos_jax.

A checkpoint carries no config: the model's settings come from a relpos_jax config (e.g.
``configs/txl_large_wt103.py``), and every variable's shape is checked against it. The names are
those of ``tf/model.py`` (``tf.layers.dense`` kernels are ``[in, out]``, as ours; N heads, H head
dim, D model, F feed-forward, E d_embed, d_i cluster widths, C tail clusters):

    transformer/layer_l/rel_attn/qkv/kernel [D, 3·N·H] -> [D, 3, N, H]: w_q = [:, 0], w_kv = [:, 1:]
    transformer/layer_l/rel_attn/r/kernel [D, N·H] -> position/w_r [D, N, H]
    transformer/layer_l/rel_attn/o/kernel [N·H, D] -> w_o [N, H, D]
    transformer/layer_l/rel_attn/LayerNorm/{gamma,beta} -> norm_attention/{scale,bias}
    transformer/layer_l/ff/layer_{1,2}/{kernel,bias} -> feed_forward/{up,down}/{kernel,bias}
    transformer/layer_l/ff/LayerNorm/{gamma,beta} -> norm_feed_forward/{scale,bias}
    transformer/r_w_bias, r_r_bias [N, H] (txl.untie_r: [L, N, H]) -> position/u, v (per layer with it)
    transformer/adaptive_embed/cutoff_i/lookup_table [V_i, d_i] -> vocab/embed_i
    transformer/adaptive_embed/cutoff_i/proj_W [d_i, D] -> vocab/proj_i [D, d_i] (transposed)
      (div_val 1: adaptive_embed/lookup_table [V, E] and proj_W [E, D], without cutoff_i)
    transformer/adaptive_softmax/cutoff_i/b [V_i] -> vocab/bias_i
    transformer/adaptive_softmax/cutoff_i/proj [d_i, D] -> vocab/out_proj_i (transposed; only
      where not tie_projs[i], which then reads the input's proj_W)
    transformer/adaptive_softmax/cutoff_0/cluster_{W,b} [C, E], [C] -> cluster_weight, cluster_bias
      with the rows reversed (see ``relpos_jax.convert.huggingface``: TensorFlow scores cluster i
      with head column V_0 + i − 1, ``AdaptiveVocab`` with column −i)
    without cutoffs: adaptive_embed/lookup_table -> embed/embedding, adaptive_softmax/bias ->
      output_bias (``model.output_bias=True``; without it, refused unless zero)

A projection the checkpoint lacks where its width equals D (``proj_same_dim=False``) is the
identity. The TensorFlow model always ties the output tables to the input ones, and has no
pre-norm. Optimizer slots (``…/Adam``, ``…/Adam_1``) and the step counters are ignored; any other
variable that the config does not use is refused (a checkpoint with more layers, say).
"""

from __future__ import annotations

import itertools
import pathlib
from typing import Any

import ml_collections
import numpy as np

from relpos_jax.config import Config
from relpos_jax.convert import common
from relpos_jax.convert.common import ConvertError, Tensors, fields

FIX = "pass --config with the settings the checkpoint was trained with (e.g. configs/txl_large_wt103.py)"


def open_checkpoint(source: str | pathlib.Path) -> Tensors:
    """The variables of a checkpoint prefix (``…/model.ckpt-0``) or of a folder's latest one."""
    tf = common.need("tensorflow", "reading a TensorFlow checkpoint")
    path = pathlib.Path(source)
    prefix = str(path)
    if path.is_dir():
        prefix = tf.train.latest_checkpoint(str(path))
        if prefix is None:
            raise ConvertError(
                f"--source={str(path)!r} is a folder without a TensorFlow checkpoint (no "
                "'checkpoint' file); pass a checkpoint prefix such as model/model.ckpt-0"
            )
    elif not pathlib.Path(prefix + ".index").is_file():
        raise ConvertError(
            f"--source={prefix!r} is not a TensorFlow checkpoint ({prefix}.index does not exist); "
            "pass the prefix of the .index/.data files, such as model/model.ckpt-0"
        )
    try:
        reader = tf.train.load_checkpoint(prefix)
        shapes = reader.get_variable_to_shape_map()
    except Exception as error:  # unreadable files: tf's errors are many lines
        raise ConvertError(
            f"{prefix} cannot be read by TensorFlow ({common.first_line(error)})"
        ) from None

    def read(name: str):
        try:
            return reader.get_tensor(name)
        except Exception as error:  # its data file truncated or garbled
            raise ConvertError(
                f"{name} cannot be read from {prefix} ({common.first_line(error)}); {FIX}"
            ) from None

    return Tensors(prefix, {k: tuple(v) for k, v in shapes.items()}, read, FIX)


def _check_config(cfg: Config) -> None:
    m = cfg.model
    checks = (
        (m.position == "txl", "model.position", m.position, "use txl: the checkpoint is Transformer-XL"),
        (not m.pre_norm, "model.pre_norm", m.pre_norm, "use False: the TensorFlow model is post-norm"),
        (m.tie_embeddings, "model.tie_embeddings", m.tie_embeddings, "use True: TensorFlow ties them"),
    )  # fmt: skip
    for ok, field, value, fix in checks:
        if not ok:
            raise ConvertError(f"{field}={value!r} is invalid for a TensorFlow checkpoint; {fix}")


def _optional_projection(src: Tensors, name: str, width: int, d: int, why: str) -> np.ndarray:
    """``name`` ``[width, D]`` transposed to ours ``[D, width]``; the identity where the checkpoint
    has none and width is D (``proj_same_dim=False``)."""
    if not src.has(name) and width == d:
        return np.eye(d, dtype=np.float32)
    return src.get(name, (width, d), why).T


def convert_params(cfg: Config, src: Tensors) -> dict[str, np.ndarray]:
    """relpos_jax parameters (``"path": array``) from the official variables, shapes checked."""
    m = cfg.model
    d, n, h, f = m.d_model, m.n_heads, m.head_dim, m.d_ff
    heads, ff = fields(m, "d_model", "n_heads", "d_head"), fields(m, "d_model", "d_ff")
    out: dict[str, np.ndarray] = {}
    for layer in range(m.n_layers):
        pre, ours = f"transformer/layer_{layer}/", f"blocks/{layer}/"
        layer_heads = heads + f", model.n_layers={m.n_layers}"
        qkv = src.get(pre + "rel_attn/qkv/kernel", (d, 3 * n * h), layer_heads).reshape(d, 3, n, h)
        out[ours + "attention/w_q"], out[ours + "attention/w_kv"] = qkv[:, 0], qkv[:, 1:]
        r = src.get(pre + "rel_attn/r/kernel", (d, n * h), layer_heads)
        out[ours + "attention/position/w_r"] = r.reshape(d, n, h)
        out[ours + "attention/w_o"] = src.get(pre + "rel_attn/o/kernel", (n * h, d), layer_heads)
        out[ours + "attention/w_o"] = out[ours + "attention/w_o"].reshape(n, h, d)
        for scope, norm in (("rel_attn", "norm_attention"), ("ff", "norm_feed_forward")):
            out[ours + f"{norm}/scale"] = src.get(pre + f"{scope}/LayerNorm/gamma", (d,), ff)
            out[ours + f"{norm}/bias"] = src.get(pre + f"{scope}/LayerNorm/beta", (d,), ff)
        for theirs, dense, shape in (("layer_1", "up", (d, f)), ("layer_2", "down", (f, d))):
            out[ours + f"feed_forward/{dense}/kernel"] = src.get(
                pre + f"ff/{theirs}/kernel", shape, ff
            )
            out[ours + f"feed_forward/{dense}/bias"] = src.get(
                pre + f"ff/{theirs}/bias", shape[1:], ff
            )
    for theirs, ours in (("r_w_bias", "u"), ("r_r_bias", "v")):
        name = f"transformer/{theirs}"
        if m.txl.untie_r:
            why = heads + f", model.n_layers={m.n_layers}, model.txl.untie_r=True"
            stacked = src.get(name, (m.n_layers, n, h), why)
            for layer in range(m.n_layers):
                out[f"blocks/{layer}/attention/position/{ours}"] = stacked[layer]
        else:
            out[f"position/{ours}"] = src.get(name, (n, h), heads + ", model.txl.untie_r=False")
    _vocab(cfg, src, out)
    unused = src.unused(_ignored)
    if unused:
        raise ConvertError(
            f"{src.where} holds {common.listed(unused)} that the config does not "
            f"use ({fields(m, 'n_layers', 'cutoffs', 'tie_projs')}); {FIX}"
        )
    return out


def _vocab(cfg: Config, src: Tensors, out: dict) -> None:
    m = cfg.model
    d, vocab, cutoffs = m.d_model, m.vocab_size, m.cutoffs
    embed, softmax = "transformer/adaptive_embed/", "transformer/adaptive_softmax/"
    why = fields(m, "vocab_size", "cutoffs", "d_model", "d_embed", "div_val")
    if not cutoffs:
        out["embed/embedding"] = src.get(embed + "lookup_table", (vocab, d), why)
        bias = src.get(softmax + "bias", (vocab,), why)
        if m.output_bias:
            out["output_bias"] = bias
        elif np.any(bias):
            raise ConvertError(
                f"{softmax}bias is not zero in {src.where}, and model.output_bias=False gives the "
                "tied softmax no bias; pass --override model.output_bias=True"
            )
        return
    bounds = (0, *cutoffs, vocab)
    sizes = [b - a for a, b in itertools.pairwise(bounds)]
    e, div_val = m.embed_dim, m.div_val
    widths = [e // div_val**i for i in range(len(sizes))]
    projected = div_val > 1 or e != d
    if div_val == 1:
        out["vocab/embed_0"] = src.get(embed + "lookup_table", (vocab, e), why)
        if projected:
            out["vocab/proj_0"] = src.get(embed + "proj_W", (e, d), why).T
    else:
        for i, (size, width) in enumerate(zip(sizes, widths, strict=True)):
            scope = embed + f"cutoff_{i}/"
            out[f"vocab/embed_{i}"] = src.get(scope + "lookup_table", (size, width), why)
            out[f"vocab/proj_{i}"] = _optional_projection(src, scope + "proj_W", width, d, why)
    tie_projs = m.tie_projs or (False,) * len(sizes)
    for i, (size, width) in enumerate(zip(sizes, widths, strict=True)):
        scope = softmax + f"cutoff_{i}/"
        out[f"vocab/bias_{i}"] = src.get(scope + "b", (size,), why)
        if projected and not tie_projs[i]:
            out[f"vocab/out_proj_{i}"] = _optional_projection(
                src, scope + "proj", width, d, why + f", model.tie_projs={m.tie_projs!r}"
            )
    clusters = len(cutoffs)  # reversed: see the module docstring
    cluster_w = src.get(softmax + "cutoff_0/cluster_W", (clusters, e), why)
    out["vocab/cluster_weight"] = cluster_w[::-1]
    out["vocab/cluster_bias"] = src.get(softmax + "cutoff_0/cluster_b", (clusters,), why)[::-1]


def _ignored(name: str) -> bool:
    """Optimizer slots and counters: not the model's."""
    return (
        not name.startswith("transformer/")
        or name.endswith(("/Adam", "/Adam_1", "/Momentum"))
        or name.split("/")[-1] in ("global_step", "beta1_power", "beta2_power")
    )


def convert(source, config: ml_collections.ConfigDict | Config, workdir) -> dict[str, Any]:
    """Convert the checkpoint ``source`` (prefix or folder) of the model ``config`` describes
    into the run directory ``workdir``. Returns ``config`` (the written file's path),
    ``config_object`` and ``model``."""
    cfg = Config.from_any(config)
    _check_config(cfg)
    src = open_checkpoint(source)
    params = convert_params(cfg, src)
    lm = common.assemble(cfg.model, params)
    header = (
        f"Converted from the TensorFlow checkpoint {src.where} by python -m relpos_jax.convert "
        "tensorflow.\n\nEvaluate with python eval.py --config <this file> --workdir <its folder>."
    )
    path = common.write_run(cfg, lm, workdir, header=header)
    return {"config": path, "vocab": None, "config_object": cfg, "model": lm}
