"""Every Triton kernel, forward and backward, compiled to cubin for an H100/H200 (sm_90) and an
A100 (sm_80) without a GPU (``kernel.cubin``: the triton wheel's compiler and ptxas), with the
block, warps and stages ``kernel.fit`` picks for that chip: within its shared memory and
``fit.shared_bytes``' bound, spilling at most ``cubin.SPILL_BUDGET`` bytes a thread, and with no
read of ``skew``'s scratch buffer pipelined ahead of its store. ``make test-cubin`` runs it (the
cubin extra); without the wheel it is skipped."""

from __future__ import annotations

import jax.numpy as jnp
import pytest

from relpos_jax.attention.kernel import cubin, fit
from relpos_jax.ops import backend

pytest.importorskip("triton", reason="needs the cubin extra (the triton wheel): make test-cubin")

CHIPS = {90: "NVIDIA H200", 80: "NVIDIA A100-SXM4-80GB"}


@pytest.mark.parametrize("arch", CHIPS)
@pytest.mark.parametrize("dtype", ["bfloat16", "float32"])
@pytest.mark.parametrize("head_dim", [32, 64, 128])
@pytest.mark.parametrize("scheme", cubin.TERMS)
def test_every_kernel_fits_the_chip_it_is_launched_on(scheme, head_dim, dtype, arch):
    with backend.target("gpu", CHIPS[arch]):
        kernels = cubin.attention(scheme, head_dim, getattr(jnp, dtype))
    terms = cubin.TERMS[scheme]
    size = jnp.dtype(dtype).itemsize
    block = fit.block(terms, head_dim, size, arch)
    for backward, lowered in enumerate(kernels):
        compiled = cubin.compile_kernel(lowered, arch)
        assert compiled.problems() == [], (lowered.name, block, compiled)
        bound = fit.shared_bytes(terms, block, head_dim, size, bool(backward), arch)
        assert compiled.shared <= bound, (block, compiled, bound)


def test_the_first_launch_is_what_an_h200_refused():
    """Block 64, 4 warps, 2 stages (the launch the H200 ran): Transformer-XL's backward asks for
    the shared memory the H200 refused, and the pipeliner reads the scratch buffer early."""
    forward, backward = cubin.attention("txl", 64, jnp.bfloat16, block=64)
    before = [cubin.compile_kernel(k, 90, num_warps=4, num_stages=2) for k in (forward, backward)]
    assert before[1].shared == 254_208  # "requested 254208, available: 232448"
    assert [k.early_reads for k in before] == [2, 6]
    assert all(cubin.compile_kernel(k, 90).early_reads == 0 for k in (forward, backward))
