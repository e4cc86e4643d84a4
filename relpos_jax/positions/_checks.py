"""Argument checks shared by the position functions.

Every check raises ``ValueError`` with one line that names the function, the argument, the value
received and the fix, so a mistake in a notebook reads like an instruction, not a traceback puzzle.
Checks run on static (Python) values only, so they cost nothing under ``jax.jit``.
"""

from __future__ import annotations

from typing import Any


def fail(func: str, arg: str, value: Any, fix: str) -> None:
    raise ValueError(f"{func}: {arg}={value!r} is invalid; {fix}")


def positive_int(func: str, arg: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        fail(func, arg, value, f"pass a positive integer for {arg}")
    return value


def even_int(func: str, arg: str, value: Any) -> int:
    positive_int(func, arg, value)
    if value % 2:
        fail(func, arg, value, f"{arg} must be even (sin/cos or rotation pairs); use {value + 1}")
    return value


def positive_float(func: str, arg: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        fail(func, arg, value, f"pass a positive number for {arg}")
    return float(value)


def ndim(func: str, arg: str, array: Any, expected: int | tuple[int, ...], layout: str) -> None:
    allowed = (expected,) if isinstance(expected, int) else expected
    if getattr(array, "ndim", None) not in allowed:
        shape = getattr(array, "shape", None)
        fail(func, f"{arg}.shape", shape, f"expected layout {layout}")
