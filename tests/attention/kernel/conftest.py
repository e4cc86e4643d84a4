"""``float32_products``, for the kernel tests that hold float32 results to float64 references
within about 1e-6 (``kernel_vs_reference_test``, ``kernel_vs_tiled_test``): on a GPU, Pallas'
Triton lowering (like XLA) multiplies float32 operands in TF32 unless told otherwise, about 1e-3
relative (the Triton IR's ``inputPrecision = tf32``); ``jax.default_matmul_precision("highest")``
makes them IEEE float32 products. On a CPU, where the kernels run in Pallas' interpreter, it
changes no result. The compile checks (``kernel_cubin_test``) keep the precision the model
launches the kernels with."""

from __future__ import annotations

import jax
import pytest


@pytest.fixture
def float32_products():
    with jax.default_matmul_precision("highest"):
        yield
