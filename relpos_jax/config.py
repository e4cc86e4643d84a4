"""Config files -> ConfigDict -> frozen, validated dataclasses.

``load_config(path)`` loads a config file exactly as ``--config path`` would. ``ModelConfig.from_any``
turns ``config.model`` (a ConfigDict, a dict or a ModelConfig) into a frozen dataclass, checking every
field once so that a mistake ends in one line naming the field, the value and the fix.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import pathlib
import sys
from collections.abc import Mapping
from typing import Any

import ml_collections

POSITIONS = ("txl", "shaw", "t5", "alibi", "rope", "sinusoid", "learned", "deberta", "none")
RELATIVE_POSITIONS = ("txl", "shaw", "t5", "alibi", "rope", "deberta", "none")


class ConfigError(ValueError):
    """An invalid config value; the message is one line: field, value, fix."""


def fail(field: str, value: Any, fix: str) -> None:
    raise ConfigError(f"{field}={value!r} is invalid; {fix}")


def load_config(path: str | pathlib.Path) -> ml_collections.ConfigDict:
    """The ConfigDict of a config file (``get_config()``), as ``--config path`` would load it."""
    path = pathlib.Path(path)
    if not path.is_file():
        fail("config", str(path), "pass an existing config file such as configs/txl_small.py")
    # Config files import their siblings (``from configs import base``): make the folder's parent
    # importable, as it is when train.py runs from the repository root.
    root = str(path.resolve().parent.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    spec = importlib.util.spec_from_file_location(f"_relpos_config_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def _check_int(field: str, value: Any, low: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < low:
        fail(field, value, f"use an integer ≥ {low}")


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

    def __post_init__(self) -> None:
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
        if isinstance(config, ml_collections.ConfigDict):
            config = config.to_dict()
        if not isinstance(config, Mapping):
            fail("model", type(config).__name__, "pass config.model (a ConfigDict) or a dict")
        known = {f.name for f in dataclasses.fields(cls)}
        for name in config:
            if name not in known:
                fail(
                    f"model.{name}",
                    config[name],
                    f"not a model field; known fields: {sorted(known)}",
                )
        values = dict(config)
        if values.get("rope_scaling") is not None:
            values["rope_scaling"] = dict(values["rope_scaling"])
        return cls(**values)
