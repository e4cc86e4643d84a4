"""Config files -> ConfigDict -> typed fields: how ``relpos_jax.config``'s sections are read.

``configs/base.py`` is the one source of every field, its default and its type.
``load_config(path)`` loads a config file exactly as ``--config path`` would, overrides parsed as on
the command line; ``defaults()`` is a fresh copy of base.py's config; ``section(name)`` makes a
class into the frozen dataclass of base.py's section ``name`` (its fields checked against base.py's
at import), built by ``from_any`` from a ConfigDict, a mapping of some of its fields or itself,
every value written through base.py's typed ConfigDict so that a wrong type or an unknown field
ends in one line.
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
from ml_collections import config_flags

from relpos_jax import schemes
from relpos_jax.errors import fail


def load_config(
    path: str | pathlib.Path, overrides: Sequence[str] = ()
) -> ml_collections.ConfigDict:
    """The ConfigDict of a config file (``get_config()``), as ``--config path`` would load it, with
    ``overrides`` such as ``"model.mem_len=0"`` applied by the same parser as ``--config.model.mem_len=0``
    on the command line (so a sweep's settings read exactly as its ``train.py`` command lines)."""
    given = str(path)  # path or path:argument, for get_config(argument)
    path = pathlib.Path(given.partition(":")[0])
    if not path.is_file():
        fail("config", str(path), "pass an existing config file such as configs/txl_small.py")
    # Config files import their siblings (``from configs import base``): make the folder's parent
    # importable, as it is when train.py runs from the repository root.
    root = str(path.resolve().parent.parent)
    if root not in sys.path:
        sys.path.insert(0, root)
    argv = ["load_config", f"--config={given}", *(f"--config.{o}" for o in overrides)]
    flag_values = flags.FlagValues()
    config_flags.DEFINE_config_file(
        "config", None, "config file", flag_values=flag_values, lock_config=False, sys_argv=argv
    )
    try:
        flag_values(argv)
    except (flags.Error, AttributeError, KeyError, TypeError, ValueError) as error:
        named = (o for o in overrides if o.split("=", 1)[0].rsplit(".", 1)[-1] in str(error))
        bad = next(named, list(overrides))
        for override in overrides:  # a scheme's former flat field names its new one
            field, _, value = override.partition("=")
            if (new := schemes.renamed_fields().get(field.removeprefix("model."))) is not None:
                fail(field, value, f"renamed: use --config.model.{new}={value}")
        fail("override", bad, f"name a field of configs/base.py with a value of its type ({error})")
    return flag_values["config"].value


def defaults() -> ml_collections.ConfigDict:
    """A fresh copy of ``configs/base.py``'s config: every field with its default and type."""
    from configs import base

    return base.get_config()


def _typed_section(name: str, values: Any) -> dict[str, Any]:
    """``values`` written into base.py's section ``name``, which refuses a value of another type; the
    gaps a ConfigDict leaves (None where the default is not, a bool for an int, NaN or ±inf) are
    closed here. Unknown fields are refused; a scheme's settings (``model.<scheme>``) are written
    field by field alike. Returns the whole section as a dict."""
    section = defaults()[name]
    _write_typed(name, section, values)
    return section.to_dict()


def _write_typed(name: str, section: ml_collections.ConfigDict, values: Any) -> None:
    if isinstance(values, ml_collections.ConfigDict):
        values = values.to_dict()
    if not isinstance(values, Mapping):
        fail(name, type(values).__name__, f"pass config.{name} (a ConfigDict) or a dict")
    for field, value in values.items():
        if field not in section:
            if name == "model" and (new := schemes.renamed_fields().get(field)) is not None:
                fail(f"model.{field}", value, f"renamed: use model.{new}")
            fail(f"{name}.{field}", value, f"not a {name} field; known: {sorted(section)}")
        if isinstance(section[field], ml_collections.ConfigDict):  # a scheme's settings
            _write_typed(f"{name}.{field}", section[field], value)
            continue
        kind = section.get_type(field)
        expected = f"use a value of type {kind.__name__}" + (
            " or None" if section[field] is None else ""
        )
        if isinstance(value, Mapping) and not isinstance(value, dict):
            value = dict(value)  # a FrozenDict (rope_scaling of a validated config)
        if value is None and section[field] is not None:
            fail(f"{name}.{field}", value, expected)
        if isinstance(value, list) and kind is tuple:
            value = tuple(value)  # a list from JSON or a flag
        if isinstance(value, bool) and kind is not bool:
            fail(f"{name}.{field}", value, expected)
        try:
            section[field] = value
        except (TypeError, ValueError):
            fail(f"{name}.{field}", value, expected)
        if isinstance(section[field], float) and not math.isfinite(section[field]):
            fail(f"{name}.{field}", value, "use a finite number")


class Section:
    """What every section shares: built from a ConfigDict, a mapping or itself."""

    SECTION = ""

    @classmethod
    def from_any(cls, config: Any):
        """From ``config.<section>`` (a ConfigDict), a mapping of some of its fields (the rest keep
        base.py's defaults), or an instance; a wrong type or an unknown field is refused."""
        if isinstance(config, cls):
            return config
        return cls(**_typed_section(cls.SECTION, config))


def section(name: str):
    """Class decorator: a frozen dataclass of base.py's section ``name``, with base.py's defaults.

    The class annotates the fields (for readers and type checkers); base.py gives their defaults,
    and a field that one names and the other does not stops the import. A scheme's settings
    (``model.<scheme>``, declared by its module) become fields too, each a ``FrozenConfigDict``:
    read as ``config.shaw.max_distance``, hashable, immutable."""

    def build(cls: type) -> type:
        default = defaults()[name]
        own = [f for f in default if isinstance(default[f], ml_collections.ConfigDict)]
        annotated = list(cls.__annotations__)
        if set(annotated) != set(default) - set(own):
            raise TypeError(
                f"{cls.__name__} and configs/base.py's {name} section differ: "
                f"{sorted(set(annotated) ^ (set(default) - set(own)))}"
            )
        for field in own:
            cls.__annotations__[field] = "ml_collections.FrozenConfigDict"
            setattr(cls, field, ml_collections.FrozenConfigDict(default[field]))
        for field in annotated:
            setattr(cls, field, default[field])
        cls.SECTION = name
        return dataclasses.dataclass(frozen=True)(cls)

    return build
