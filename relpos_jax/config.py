"""Config files -> ConfigDict -> frozen, validated dataclasses.

``load_config(path)`` loads a config file exactly as ``--config path`` would. ``ModelConfig.from_any``
turns ``config.model`` (a ConfigDict, a dict or a ModelConfig) into a frozen dataclass, checking every
field once so that a mistake ends in one line naming the field, the value and the fix.
"""

from __future__ import annotations

import dataclasses
import math
import pathlib
import sys
from collections.abc import Mapping, Sequence
from typing import Any

import ml_collections
from absl import flags
from flax.core import FrozenDict
from ml_collections import config_flags

POSITIONS = ("txl", "shaw", "t5", "alibi", "rope", "sinusoid", "learned", "deberta", "none")
RELATIVE_POSITIONS = ("txl", "shaw", "t5", "alibi", "rope", "deberta", "none")


class ConfigError(ValueError):
    """An invalid config value; the message is one line: field, value, fix."""


def fail(field: str, value: Any, fix: str) -> None:
    raise ConfigError(f"{field}={value!r} is invalid; {fix}")


def load_config(
    path: str | pathlib.Path, overrides: Sequence[str] = ()
) -> ml_collections.ConfigDict:
    """The ConfigDict of a config file (``get_config()``), as ``--config path`` would load it, with
    ``overrides`` such as ``"model.mem_len=0"`` applied by the same parser as ``--config.model.mem_len=0``
    on the command line (so a sweep's settings read exactly as its ``train.py`` command lines)."""
    path = pathlib.Path(path)
    if not path.is_file():
        fail("config", str(path), "pass an existing config file such as configs/txl_small.py")
    # Config files import their siblings (``from configs import base``): make the folder's parent
    # importable, as it is when train.py runs from the repository root.
    root = str(path.resolve().parent.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    argv = ["load_config", f"--config={path}", *(f"--config.{o}" for o in overrides)]
    flag_values = flags.FlagValues()
    config_flags.DEFINE_config_file(
        "config", None, "config file", flag_values=flag_values, lock_config=False, sys_argv=argv
    )
    try:
        flag_values(argv)
    except (flags.Error, AttributeError, KeyError, TypeError, ValueError) as error:
        named = (o for o in overrides if o.split("=", 1)[0].rsplit(".", 1)[-1] in str(error))
        bad = next(named, list(overrides))
        fail("override", bad, f"name a field of configs/base.py with a value of its type ({error})")
    return flag_values["config"].value


def _check_int(field: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        fail(field, value, f"use an integer ≥ {low}")


_TYPES = {"int": int, "float": int | float, "bool": bool, "str": str}


def check_types(section: str, instance: Any) -> None:
    """Every field has the type its annotation names (``int | None`` allows None; a float field
    takes an int; bool is never an int) before any range check runs."""
    for field in dataclasses.fields(instance):
        value = getattr(instance, field.name)
        kinds = [k.strip() for k in str(field.type).split("|")]
        if value is None and "None" in kinds:
            continue
        base = kinds[0]
        if base.startswith("Mapping"):
            ok = isinstance(value, Mapping)
        elif base.startswith("tuple"):
            ok = isinstance(value, tuple | list) and all(
                isinstance(v, int) and not isinstance(v, bool) for v in value
            )
        else:
            ok = isinstance(value, _TYPES[base]) and (base == "bool" or not isinstance(value, bool))
        if not ok:
            fail(f"{section}.{field.name}", value, f"use a value of type {field.type}")
        if isinstance(value, float) and not math.isfinite(value):
            fail(f"{section}.{field.name}", value, "use a finite number")


def _check_rate(field: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < 1:
        fail(field, value, "use a probability in [0, 1)")


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """The model section of a config; see configs/base.py for what each field means."""

    position: str = "txl"
    vocab_size: int = 256
    n_layers: int = 6
    d_model: int = 256
    n_heads: int = 4
    d_head: int | None = None
    d_ff: int = 1024
    dropout: float = 0.1
    dropatt: float = 0.0
    mem_len: int = 128
    same_length: bool = False
    clamp_len: int | None = None
    untie_r: bool = False
    pre_norm: bool = False
    remat: bool = False
    tie_embeddings: bool = True
    init_std: float = 0.02
    max_len: int = 4096
    rope_base: float = 10000.0
    rope_scaling: Mapping[str, Any] | None = None
    rope_fraction: float = 1.0
    rope_interleaved: bool = False
    shaw_max_distance: int = 64
    t5_num_buckets: int = 32
    t5_max_distance: int = 128
    deberta_bucket_size: int = 256
    deberta_max_position: int = 512
    dtype: str = "float32"

    def __post_init__(self) -> None:
        check_types("model", self)
        if self.dtype not in ("float32", "bfloat16"):
            fail("model.dtype", self.dtype, "use float32 or bfloat16")
        if self.position not in POSITIONS:
            fail("model.position", self.position, f"use one of {', '.join(POSITIONS)}")
        for name in (
            "vocab_size",
            "n_layers",
            "d_model",
            "n_heads",
            "d_ff",
            "max_len",
            "shaw_max_distance",
            "t5_num_buckets",
            "t5_max_distance",
            "deberta_bucket_size",
            "deberta_max_position",
        ):
            _check_int(f"model.{name}", getattr(self, name), 1)
        _check_int("model.mem_len", self.mem_len, 0)
        _check_rate("model.dropout", self.dropout)
        _check_rate("model.dropatt", self.dropatt)
        if self.d_model % self.n_heads:
            fail(
                "model.n_heads",
                self.n_heads,
                f"it must divide model.d_model={self.d_model} (e.g. {self._divisor_hint()})",
            )
        if self.d_head is not None:
            _check_int("model.d_head", self.d_head, 1)
        for name in ("init_std", "rope_base"):
            if not getattr(self, name) > 0:
                fail(f"model.{name}", getattr(self, name), "use a positive value")
        if not 0 < self.rope_fraction <= 1:
            fail("model.rope_fraction", self.rope_fraction, "use a fraction in (0, 1]")
        if self.clamp_len is not None:
            _check_int("model.clamp_len", self.clamp_len, 1)
        if self.position in ("txl", "sinusoid") and self.d_model % 2:
            fail("model.d_model", self.d_model, "the sinusoid needs an even d_model")
        if self.position == "rope":
            from relpos_jax.positions import rope_inv_freq

            try:
                rope_inv_freq(
                    self.head_dim,
                    self.rope_base,
                    self.rope_scaling,
                    partial_rotary_factor=self.rope_fraction,
                )
            except ValueError as error:
                fail(
                    "model.d_head" if "head_dim" in str(error) else "model.rope_scaling",
                    self.head_dim if "head_dim" in str(error) else self.rope_scaling,
                    f"RoPE refused it: {error}",
                )
        if self.position == "t5" and self.t5_max_distance <= self.t5_num_buckets // 2:
            fail(
                "model.t5_max_distance",
                self.t5_max_distance,
                f"it must exceed t5_num_buckets // 2 = {self.t5_num_buckets // 2}",
            )
        if self.position == "deberta" and (
            self.deberta_bucket_size % 2
            or self.deberta_max_position <= self.deberta_bucket_size // 2 + 1
        ):
            fail(
                "model.deberta_bucket_size",
                self.deberta_bucket_size,
                "use an even size below 2·(deberta_max_position − 1)",
            )

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
    def relative(self) -> bool:
        return self.position in RELATIVE_POSITIONS

    @classmethod
    def from_any(cls, config: Any) -> ModelConfig:
        """From a ConfigDict, a mapping, or a ModelConfig; unknown fields are refused."""
        if isinstance(config, cls):
            return config
        values = _section_values(cls, "model", config)
        if isinstance(values.get("rope_scaling"), Mapping):
            values["rope_scaling"] = dict(values["rope_scaling"])
        return cls(**values)


def _section_values(cls: type, section: str, config: Any) -> dict[str, Any]:
    if isinstance(config, ml_collections.ConfigDict):
        config = config.to_dict()
    if not isinstance(config, Mapping):
        fail(section, type(config).__name__, f"pass config.{section} (a ConfigDict) or a dict")
    known = {f.name for f in dataclasses.fields(cls)}
    for name in config:
        if name not in known:
            fail(
                f"{section}.{name}", config[name], f"not a {section} field; known: {sorted(known)}"
            )
    return dict(config)


@dataclasses.dataclass(frozen=True)
class DataConfig:
    name: str = "pystdlib"
    path: str | None = None
    dir: str | None = None
    segment_len: int = 128
    batch_size: int = 16

    def __post_init__(self) -> None:
        check_types("data", self)
        known = ("pystdlib", "text", "enwik8", "text8")
        if not isinstance(self.name, str) or not (
            self.name in known or self.name.startswith(("tfds:", "probe:"))
        ):
            fail(
                "data.name",
                self.name,
                f"use one of {', '.join(known)}, tfds:<name> or probe:<kind>:<distance>",
            )
        _check_int("data.segment_len", self.segment_len, 1)
        _check_int("data.batch_size", self.batch_size, 1)


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    steps: int = 1000
    lr: float = 2.5e-4
    warmup_steps: int = 0
    min_lr_ratio: float = 0.0
    optimizer: str = "adam"
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    clip: float = 0.25
    grad_accum: int = 1
    seed: int = 0
    log_every: int = 50
    eval_every: int = 500
    eval_tokens: int = 131072
    ckpt_every: int = 500
    keep_checkpoints: int = 3
    skip_nonfinite: bool = False
    max_consecutive_skips: int = 10

    def __post_init__(self) -> None:
        check_types("train", self)
        for name in (
            "steps",
            "log_every",
            "grad_accum",
            "keep_checkpoints",
            "max_consecutive_skips",
        ):
            _check_int(f"train.{name}", getattr(self, name), 1)
        for name in ("warmup_steps", "eval_every", "eval_tokens", "ckpt_every", "seed"):
            _check_int(f"train.{name}", getattr(self, name), 0)
        if isinstance(self.lr, bool) or not isinstance(self.lr, int | float) or not self.lr > 0:
            fail("train.lr", self.lr, "use a positive learning rate such as 2.5e-4")
        if self.optimizer not in ("adam", "adamw"):
            fail("train.optimizer", self.optimizer, "use adam or adamw")
        for name in ("min_lr_ratio", "b1", "b2"):
            if not 0 <= getattr(self, name) <= 1:
                fail(f"train.{name}", getattr(self, name), "use a value in [0, 1]")
        for name in ("clip", "weight_decay"):
            if getattr(self, name) < 0:
                fail(f"train.{name}", getattr(self, name), "use 0 (off) or a positive value")


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    segment_len: int | None = None
    mem_len: int | None = None
    clamp_len: int | None = None
    same_length: bool | None = None
    batch_size: int = 16
    lengths: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        check_types("eval", self)
        _check_int("eval.batch_size", self.batch_size, 1)
        for name, low in (("segment_len", 1), ("mem_len", 0), ("clamp_len", 1)):
            if getattr(self, name) is not None:
                _check_int(f"eval.{name}", getattr(self, name), low)
        for length in self.lengths:
            _check_int("eval.lengths", length, 1)


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    data: int = -1
    fsdp: int = 1
    tensor: int = 1

    def __post_init__(self) -> None:
        check_types("mesh", self)
        for name in ("data", "fsdp", "tensor"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or (value < 1 and value != -1):
                fail(f"mesh.{name}", value, "use a positive axis size or -1 (the devices left)")


SECTIONS = {"data": DataConfig, "train": TrainConfig, "eval": EvalConfig, "mesh": MeshConfig}


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

    @classmethod
    def from_any(cls, config: Any) -> Config:
        if isinstance(config, cls):
            return config
        values = _section_values(cls, "config", config)
        parsed = {
            name: section(**_section_values(section, name, values.get(name, {})))
            for name, section in SECTIONS.items()
        }
        parsed["eval"] = dataclasses.replace(parsed["eval"], lengths=tuple(parsed["eval"].lengths))
        return cls(model=ModelConfig.from_any(values.get("model", {})), **parsed)
