"""What both routes share: reading named tensors with their shapes checked, filling a
``TransformerLM`` with the converted arrays, and writing the run directory.

A converted run directory holds what ``train.py`` would leave for evaluation: ``config.py`` (a
config file, ``get_config()`` from ``configs/base.py`` with every field written out) and
``checkpoints/0`` (orbax, through ``relpos_jax.checkpoint.Checkpointer``) whose ``state`` item is
``{0: model state}`` — the model half of what training saves, which is all that
``relpos_jax.evaluate.restore_model`` (and so ``eval.py``) reads. It holds no optimizer state and
no data position: it is for evaluation, not for resuming training.
"""

from __future__ import annotations

import dataclasses
import importlib
import pathlib
from collections.abc import Callable, Mapping
from typing import Any

import jax
import ml_collections
import numpy as np
from flax import nnx

from relpos_jax import layers
from relpos_jax.config import Config, ModelConfig
from relpos_jax.model import TransformerLM
from relpos_jax.sharding import path_string

EXTRA = "pip install -e '.[convert]' (or run make test-convert, which sets up .venv-convert)"


class ConvertError(ValueError):
    """A conversion that cannot go on; the message is one line naming the thing and the fix."""


def need(module: str, purpose: str) -> Any:
    """``import module``, or a ConvertError saying how to install it."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ConvertError(
            f"{purpose} needs the Python package {module.split('.')[0]!r}, which is not "
            f"installed ({error}); install the convert extra: {EXTRA}"
        ) from None


class Tensors:
    """The named tensors of a checkpoint, each fetched with the shape the config expects.

    ``shapes`` maps every name to its stored shape and ``read`` loads one; ``where`` names the
    checkpoint and ``fix`` says what to do on a mismatch, in the one-line errors. Names fetched are
    remembered, so that the caller can refuse tensors that nothing used."""

    def __init__(
        self,
        where: str,
        shapes: Mapping[str, tuple[int, ...]],
        read: Callable[[str], Any],
        fix: str,
    ):
        self.where, self.shapes, self.read, self.fix = where, dict(shapes), read, fix
        self.used: set[str] = set()

    def has(self, name: str) -> bool:
        return name in self.shapes

    def get(self, name: str, shape: tuple[int, ...], fields: str) -> np.ndarray:
        """Tensor ``name`` as float32, which must have ``shape`` (what ``fields`` give) and hold
        finite floating-point values."""
        shape = tuple(int(n) for n in shape)
        if name not in self.shapes:
            raise ConvertError(
                f"{self.where} has no tensor {name!r}, which {fields} needs; {self.fix}"
            )
        stored = tuple(int(n) for n in self.shapes[name])
        if stored != shape:
            raise ConvertError(
                f"{name} has shape {stored} in {self.where}, but {fields} gives {shape}; {self.fix}"
            )
        stored_array = np.asarray(self.read(name))
        if not np.issubdtype(stored_array.dtype, np.floating):
            raise ConvertError(
                f"{name} in {self.where} holds {stored_array.dtype} values, not floating point "
                f"weights; {self.fix}"
            )
        array = stored_array.astype(np.float32).reshape(shape)
        if not np.isfinite(array).all():
            raise ConvertError(
                f"{name} in {self.where} holds NaN or infinite values (in float32); {self.fix}"
            )
        self.used.add(name)
        return array

    def unused(self, ignore: Callable[[str], bool] = lambda name: False) -> list[str]:
        return sorted(n for n in self.shapes if n not in self.used and not ignore(n))


def first_line(error: BaseException) -> str:
    """An exception as one short line: its type and the first line of its message."""
    lines = str(error).strip().splitlines()
    return f"{type(error).__name__}: {lines[0][:200]}" if lines else type(error).__name__


def listed(names: list[str]) -> str:
    """``'a'``, or ``'a' (and 2 more)``: the first of some names, for a one-line error."""
    more = f" (and {len(names) - 1} more)" if len(names) > 1 else ""
    return f"{names[0]!r}{more}"


def fields(model: ModelConfig, *names: str) -> str:
    """``"model.d_model=512, model.n_heads=8"``: the config fields a shape comes from."""
    return ", ".join(f"model.{n}={getattr(model, n)!r}" for n in names)


def assemble(model_config: ModelConfig, params: Mapping[str, np.ndarray]) -> TransformerLM:
    """A ``TransformerLM`` of ``model_config`` whose parameters are ``params`` (keyed by path,
    ``"blocks/0/attention/w_q"``, layer by layer: stacked here as the model holds them), every one
    given exactly once with the model's shape. The model is never initialised at random: its shapes
    come from ``nnx.eval_shape``, its dropout counters from a compiled init whose parameters XLA
    drops."""
    params = layers.stack_layer_paths(params)
    build = lambda: TransformerLM(model_config, rngs=nnx.Rngs(0))  # noqa: E731
    graphdef, abstract, _ = nnx.split(nnx.eval_shape(build), nnx.Param, ...)
    rest = jax.jit(lambda: nnx.split(build(), nnx.Param, ...)[2])()
    wanted = {
        path_string(path): leaf for path, leaf in jax.tree_util.tree_leaves_with_path(abstract)
    }
    if set(wanted) != set(params):  # a mapping that misses or invents a parameter: a bug here
        raise AssertionError(
            f"convert: parameters missing {sorted(set(wanted) - set(params))}, "
            f"unknown {sorted(set(params) - set(wanted))}"
        )
    for name, leaf in wanted.items():
        if tuple(params[name].shape) != tuple(leaf.shape):
            raise AssertionError(f"convert: {name} is {params[name].shape}, not {leaf.shape}")
    filled = jax.tree_util.tree_map_with_path(
        lambda path, leaf: np.asarray(params[path_string(path)], leaf.dtype), abstract
    )
    return nnx.merge(graphdef, filled, rest)


def _literal(value: Any) -> str:
    if isinstance(value, ml_collections.FrozenConfigDict):  # a scheme's settings
        value = value.as_configdict().to_dict()
    if isinstance(value, Mapping):  # rope_scaling (a FrozenDict once validated)
        value = dict(value)
    return repr(value)


def config_source(config: Config, header: str) -> str:
    """A config file (``get_config()``) that gives ``config``: base.py with every field set."""
    lines = ['"""' + header.strip() + '\n"""', "", "from configs import base", "", ""]
    lines += ["def get_config():", "    c = base.get_config()"]
    for section in dataclasses.fields(config):
        values = getattr(config, section.name)
        lines.append(f"    c.{section.name}.update(")
        for field in dataclasses.fields(values):
            lines.append(f"        {field.name}={_literal(getattr(values, field.name))},")
        lines.append("    )")
    lines.append("    return c")
    return "\n".join(lines) + "\n"


def write_run(
    config: Config, model: TransformerLM, workdir: str | pathlib.Path, *, header: str
) -> pathlib.Path:
    """``workdir/config.py`` and ``workdir/checkpoints/0`` (see the module docstring); returns
    the config file's path. A workdir that already holds a checkpoint is refused."""
    from relpos_jax.checkpoint import Checkpointer, latest_step, sections

    workdir = pathlib.Path(workdir)
    directory = workdir / "checkpoints"
    if latest_step(directory) is not None:
        raise ConvertError(
            f"--workdir={str(workdir)!r} already holds a checkpoint; pass a new --workdir "
            "(or move that one away)"
        )
    workdir.mkdir(parents=True, exist_ok=True)
    checkpointer = Checkpointer(directory, keep=1)
    try:
        checkpointer.save(
            0,
            state=nnx.State({0: nnx.state(model)}),
            mems=model.init_mems(1, 0),  # no memory: evaluation starts its own
            data={},
            meta={"step": 0, "config": sections(config), "converted": header.splitlines()[0]},
        )
        checkpointer.wait()
    finally:
        checkpointer.close()
    path = workdir / "config.py"
    path.write_text(config_source(config, header))
    return path


def vocab_text(symbols: list[str]) -> str:
    """``vocab.txt``: one symbol a line, the line index its id."""
    for index, symbol in enumerate(symbols):
        if "\n" in symbol or "\r" in symbol:
            raise ConvertError(
                f"vocabulary id {index} is {symbol!r}, which cannot be one line of vocab.txt; "
                "convert without the vocabulary file (move it out of --source)"
            )
    return "".join(f"{symbol}\n" for symbol in symbols)
