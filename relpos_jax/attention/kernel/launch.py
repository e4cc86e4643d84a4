"""``pallas_call`` for either backend: block specs of the whole-array and per-head inputs, Triton's
scratch buffer, and each backend's compiler parameters."""

from __future__ import annotations

import jax
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as pltriton

from relpos_jax.attention.kernel import fit
from relpos_jax.attention.kernel.common import F32, Spec
from relpos_jax.ops import backend


def whole(shape) -> pl.BlockSpec:
    """The whole array in every program."""
    return pl.BlockSpec(tuple(shape), lambda *_: (0,) * len(shape))


def per_head(x: jax.Array, heads: int) -> bool:
    """Whether a table ``[N or 1, Rp, C]`` has rows per head (else the heads share them)."""
    return x.shape[0] == heads and heads > 1


def table(x: jax.Array, heads: int, head_axis: int) -> pl.BlockSpec:
    """A per-distance table ``[N or 1, Rp, C]``: its head's rows (all heads share one of 1)."""
    own = per_head(x, heads)

    def index(*grid):
        return (grid[head_axis] if own else 0, 0, 0)

    return pl.BlockSpec((None, *x.shape[1:]), index)


def scratch(spec: Spec, grid: tuple[int, ...]):
    """Triton's per-program ``[S, 2S]`` float32 buffer for the relative shift (``skew``)."""
    s = spec.block
    shape = (*grid, s, 2 * s)
    block = pl.BlockSpec((None,) * len(grid) + (s, 2 * s), lambda *g: (*g, 0, 0))
    return jax.ShapeDtypeStruct(shape, F32), block


def terms(spec: Spec) -> tuple[str, ...]:
    """The relative terms of a call (``kernel.fit``'s keys)."""
    return fit.terms_of(spec.band, spec.values, spec.bias, spec.tile is not None)


def vmem_limit() -> int | None:
    """The VMEM a Mosaic kernel may take: three quarters of the TensorCore's (the rest for Mosaic's
    own scratch), in place of the compiler's default scoped limit (16 or 32 MiB), which bounds the
    window the kernels hold; None (that default) where the chip is unknown."""
    capacity = backend.tpu_vmem_bytes()
    return None if capacity is None else capacity * 3 // 4


def pallas(spec: Spec, kernel, grid, inputs, in_specs, outputs, aliases=None, parallel=False):
    """Run ``kernel`` over ``grid``; ``outputs`` are (shape, block spec) pairs. ``parallel``: the
    programs are independent (the forward), which lets Mosaic split the grid over a chip's two
    TensorCores (v4, v5p); else every axis runs in order (the backward, whose per-distance
    gradients accumulate across the grid). Triton's warps and pipeline stages: ``kernel.fit``."""
    if spec.backend == "triton":
        params = pltriton.CompilerParams(
            num_warps=fit.warps(spec.block), num_stages=fit.stages(terms(spec), not parallel)
        )
    else:
        order = "parallel" if parallel else "arbitrary"
        params = pltpu.CompilerParams(
            dimension_semantics=(order,) * len(grid), vmem_limit_bytes=vmem_limit()
        )
    return pl.pallas_call(
        kernel,
        grid=grid,
        in_specs=in_specs,
        out_specs=[block for _, block in outputs],
        out_shape=[shape for shape, _ in outputs],
        input_output_aliases=aliases or {},
        compiler_params=params,
        interpret=spec.interpret,
    )(*inputs)
