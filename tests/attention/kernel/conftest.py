"""The kernel tests hold float32 results to float64 references within about 1e-6, so their
products run in float32: on a GPU, Pallas' Triton lowering (like XLA) multiplies float32 operands
in TF32 unless told otherwise, about 1e-3 relative (the Triton IR's ``inputPrecision = tf32``);
``jax.default_matmul_precision("highest")`` makes them IEEE float32 products. On a CPU, where the
kernels run in Pallas' interpreter, it changes no result."""

from __future__ import annotations

import jax
import pytest


@pytest.fixture(autouse=True)
def _float32_products():
    with jax.default_matmul_precision("highest"):
        yield
