"""Shared fixtures: float64 for reference comparisons, a seeded numpy generator."""

from __future__ import annotations

import jax
import numpy as np
import pytest


@pytest.fixture
def x64():
    """Run the fast form in float64 so that it can be held to the float64 reference."""
    with jax.enable_x64(True):
        yield


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)
