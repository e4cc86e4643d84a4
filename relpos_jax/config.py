"""Config files -> ConfigDict -> frozen, validated dataclasses.

``configs/base.py`` is the one source of every field and its default: each section here is a frozen
dataclass whose fields are that section's, with its defaults (``section`` checks at import that the
two name the same fields; reading and typing the files is ``config_source``). ``load_config(path)``
loads a config file exactly as ``--config path`` would. ``ModelConfig.from_any`` turns
``config.model`` (a ConfigDict, a dict or a ModelConfig) into the dataclass: the values go through
base.py's ConfigDict, whose fields carry their types, then each section checks its ranges, so that a
mistake ends in one line naming the field, the value and the fix.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import ml_collections
from flax.core import FrozenDict

from relpos_jax import adaptive, schemes
from relpos_jax.config_source import (  # load_config, defaults: also imported from here
    Section,
    defaults,
    load_config,  # noqa: F401
    section,
)
from relpos_jax.errors import ConfigError, at_least, fail  # ConfigError: also imported from here

POSITIONS = schemes.names()  # every registered scheme
RELATIVE_POSITIONS = tuple(name for name in POSITIONS if schemes.get(name).relative)
ATTENTION_IMPLS = ("dense", "tiled", "kernel", "auto")


def _rate(field: str, value: float) -> None:
    if not 0 <= value < 1:
        fail(field, value, "use a probability in [0, 1)")


@section("model")
class ModelConfig(Section):
    """The model section of a config; see configs/base.py for what each field means."""

    position: str
    vocab_size: int
    n_layers: int
    d_model: int
    n_heads: int
    d_head: int | None
    d_ff: int
    dropout: float
    dropatt: float
    mem_len: int
    same_length: bool
    clamp_len: int | None
    pre_norm: bool
    remat: bool
    scan_unroll: int
    tie_embeddings: bool
    output_bias: bool
    cutoffs: tuple[int, ...]
    div_val: int
    d_embed: int | None
    tie_projs: tuple[bool, ...]
    init_std: float
    rope_base: float
    rope_scaling: Mapping[str, Any] | None
    rope_fraction: float
    rope_interleaved: bool
    dtype: str
    attention_impl: str
    key_tile: int
    query_tile: int
    kernel_block: int

    def __post_init__(self) -> None:
        if self.dtype not in ("float32", "bfloat16"):
            fail("model.dtype", self.dtype, "use float32 or bfloat16")
        if self.attention_impl not in ATTENTION_IMPLS:
            fail("model.attention_impl", self.attention_impl, f"use {' or '.join(ATTENTION_IMPLS)}")
        at_least("model.key_tile", self.key_tile, 1)
        at_least("model.query_tile", self.query_tile, 1)
        if self.kernel_block and (
            self.kernel_block < 16 or self.kernel_block & (self.kernel_block - 1)
        ):
            fail(
                "model.kernel_block",
                self.kernel_block,
                "use 0 (the backend's) or a power of two ≥ 16",
            )
        schemes.get(self.position)  # an unknown name lists the registered schemes
        for name in schemes.names():  # a scheme's settings given as a dict (its defaults fill the
            own = getattr(self, name, None)  # rest): frozen, read by attribute
            if own is not None and not isinstance(own, ml_collections.FrozenConfigDict):
                default = self.__dataclass_fields__[name].default
                frozen = ml_collections.FrozenConfigDict({**default, **own})
                object.__setattr__(self, name, frozen)
        for name in (
            "vocab_size",
            "n_layers",
            "d_model",
            "n_heads",
            "d_ff",
        ):
            at_least(f"model.{name}", getattr(self, name), 1)
        at_least("model.mem_len", self.mem_len, 0)
        at_least("model.scan_unroll", self.scan_unroll, 1)
        _rate("model.dropout", self.dropout)
        _rate("model.dropatt", self.dropatt)
        if self.d_model % self.n_heads:
            fail(
                "model.n_heads",
                self.n_heads,
                f"it must divide model.d_model={self.d_model} (e.g. {self._divisor_hint()})",
            )
        if self.d_head is not None:
            at_least("model.d_head", self.d_head, 1)
        for name in ("init_std", "rope_base"):
            if not getattr(self, name) > 0:
                fail(f"model.{name}", getattr(self, name), "use a positive value")
        if not 0 < self.rope_fraction <= 1:
            fail("model.rope_fraction", self.rope_fraction, "use a fraction in (0, 1]")
        if self.clamp_len is not None:
            at_least("model.clamp_len", self.clamp_len, 1)
        if self.d_embed is not None:
            at_least("model.d_embed", self.d_embed, 1)
        if not self.cutoffs and (self.div_val != 1 or self.d_embed is not None or self.tie_projs):
            fail("model.cutoffs", (), "div_val, d_embed and tie_projs need cutoffs (clusters)")
        if self.output_bias and (self.cutoffs or not self.tie_embeddings):
            fail(
                "model.output_bias", True, "only a tied plain softmax lacks a bias; leave it False"
            )
        if self.cutoffs:
            adaptive.check(
                self.vocab_size, self.cutoffs, self.div_val, self.embed_dim, self.tie_projs
            )
        for name in schemes.names():  # every scheme's settings, then the named scheme's needs
            if (own := getattr(self, name, None)) is not None:
                schemes.get(name).check_settings(own)
        schemes.get(self.position).validate(self)
        if self.rope_scaling is not None:  # last, so that messages show the dict as given
            frozen = {
                k: tuple(v) if isinstance(v, list) else v for k, v in self.rope_scaling.items()
            }
            object.__setattr__(self, "rope_scaling", FrozenDict(frozen))  # hashable: jit static

    def _divisor_hint(self) -> str:
        return " or ".join(str(n) for n in (1, 2, 4, 8, 16) if self.d_model % n == 0)

    @property
    def head_dim(self) -> int:
        return self.d_head if self.d_head is not None else self.d_model // self.n_heads

    @property
    def embed_dim(self) -> int:
        """The embedding width (d_embed, or d_model)."""
        return self.d_model if self.d_embed is None else self.d_embed

    @property
    def relative(self) -> bool:
        return self.position in RELATIVE_POSITIONS


@section("data")
class DataConfig(Section):
    name: str
    path: str | None
    dir: str | None
    tokens: str | None
    vocab: str | None
    partition: str
    python: str | None
    segment_len: int
    batch_size: int

    def __post_init__(self) -> None:
        from relpos_jax.data import corpora  # here: config is imported where data is not needed

        try:
            corpora.check_source(self.name, self.tokens)
            corpora.check_partition(self.partition)
            corpora.check_python(self.python)
        except corpora.DataError as error:  # the config's own kind of error, the same line
            raise ConfigError(str(error)) from None
        at_least("data.segment_len", self.segment_len, 1)
        at_least("data.batch_size", self.batch_size, 1)

    @property
    def corpus_python(self) -> str | None:
        """pystdlib: the Python whose standard library is the corpus (``python``, else this one);
        None for the other corpora."""
        from relpos_jax.data import corpora

        return corpora.stdlib_python(self.name, self.python)


@section("train")
class TrainConfig(Section):
    steps: int
    lr: float
    warmup_steps: int
    min_lr_ratio: float
    optimizer: str
    weight_decay: float
    b1: float
    b2: float
    clip: float
    grad_accum: int
    seed: int
    loss_from: int
    log_every: int
    eval_every: int
    eval_tokens: int
    ckpt_every: int
    keep_checkpoints: int
    skip_nonfinite: bool
    max_consecutive_skips: int
    init_from: str | None

    def __post_init__(self) -> None:
        for name in (
            "steps",
            "log_every",
            "grad_accum",
            "keep_checkpoints",
            "max_consecutive_skips",
        ):
            at_least(f"train.{name}", getattr(self, name), 1)
        for name in (
            "warmup_steps",
            "eval_every",
            "eval_tokens",
            "ckpt_every",
            "seed",
            "loss_from",
        ):
            at_least(f"train.{name}", getattr(self, name), 0)
        if not self.lr > 0:
            fail("train.lr", self.lr, "use a positive learning rate such as 2.5e-4")
        if self.optimizer not in ("adam", "adamw"):
            fail("train.optimizer", self.optimizer, "use adam or adamw")
        for name in ("min_lr_ratio", "b1", "b2"):
            if not 0 <= getattr(self, name) <= 1:
                fail(f"train.{name}", getattr(self, name), "use a value in [0, 1]")
        for name in ("clip", "weight_decay"):
            if getattr(self, name) < 0:
                fail(f"train.{name}", getattr(self, name), "use 0 (off) or a positive value")


@section("eval")
class EvalConfig(Section):
    segment_len: int | None
    mem_len: int | None
    clamp_len: int | None
    same_length: bool | None
    batch_size: int
    lengths: tuple[int, ...]

    def __post_init__(self) -> None:
        at_least("eval.batch_size", self.batch_size, 1)
        for name, low in (("segment_len", 1), ("mem_len", 0), ("clamp_len", 1)):
            if getattr(self, name) is not None:
                at_least(f"eval.{name}", getattr(self, name), low)
        for length in self.lengths:
            at_least("eval.lengths", length, 1)
        object.__setattr__(self, "lengths", tuple(self.lengths))


@section("mesh")
class MeshConfig(Section):
    data: int
    fsdp: int
    tensor: int
    context: int

    def __post_init__(self) -> None:
        for name in ("data", "fsdp", "tensor", "context"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or (value < 1 and value != -1):
                fail(f"mesh.{name}", value, "use a positive axis size or -1 (the devices left)")


SECTIONS = {
    "model": ModelConfig,
    "data": DataConfig,
    "train": TrainConfig,
    "eval": EvalConfig,
    "mesh": MeshConfig,
}


def training_window(model: ModelConfig, segment_len: int | None = None) -> int:
    """The attention window of a training step: ``segment_len`` queries (None: base.py's
    data.segment_len) after ``model.mem_len`` memory slots. Positions count from the oldest valid
    key (``TransformerLM``), so this is the longest query position + 1 that training sees."""
    if segment_len is None:
        segment_len = defaults().data.segment_len
    return model.mem_len + segment_len


@dataclasses.dataclass(frozen=True)
class Config:
    """The whole run, validated: ``Config.from_any(load_config(path))``."""

    model: ModelConfig
    data: DataConfig
    train: TrainConfig
    eval: EvalConfig
    mesh: MeshConfig

    def __post_init__(self) -> None:
        if self.data.batch_size % self.train.grad_accum:
            fail(
                "train.grad_accum",
                self.train.grad_accum,
                f"it must divide data.batch_size={self.data.batch_size} (micro-batches split the rows)",
            )
        if self.train.loss_from >= self.data.segment_len:
            fail(
                "train.loss_from",
                self.train.loss_from,
                f"use a position below data.segment_len={self.data.segment_len} "
                f"(e.g. {self.data.segment_len // 2}, the recent half)",
            )
        # a scheme's fields whose default (None) is the training window: set here, where the data
        # section is known (FIRE's threshold)
        window = training_window(self.model, self.data.segment_len)
        scheme = schemes.get(self.model.position)
        if fields := scheme.window_fields(self.model, window):
            own = ml_collections.FrozenConfigDict({**scheme.settings(self.model), **fields})
            model = dataclasses.replace(self.model, **{scheme.name: own})
            object.__setattr__(self, "model", model)

    @classmethod
    def from_any(cls, config: Any) -> Config:
        if isinstance(config, cls):
            return config
        if isinstance(config, ml_collections.ConfigDict):
            config = config.to_dict()
        if not isinstance(config, Mapping):
            fail("config", type(config).__name__, "pass a ConfigDict (load_config) or a dict")
        for name in config:
            if name not in SECTIONS:
                fail(f"config.{name}", config[name], f"not a section; known: {sorted(SECTIONS)}")
        return cls(**{name: kind.from_any(config.get(name, {})) for name, kind in SECTIONS.items()})
