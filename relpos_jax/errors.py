"""The one kind of user error the configuration raises: one line naming the field, value and fix."""

from __future__ import annotations

from typing import Any


class ConfigError(ValueError):
    """An invalid config value; the message is one line: field, value, fix."""


def fail(field: str, value: Any, fix: str) -> None:
    shown = " ".join(repr(value).split())  # one line, even for an array or a nested dict
    raise ConfigError(f"{field}={shown} is invalid; {fix}")
