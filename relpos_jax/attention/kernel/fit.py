"""How a Triton kernel is launched on a GPU: its block size, warps and pipeline stages, chosen from
the shared memory a block may take on the chip (``backend.gpu_shared_memory``); and whether the
Mosaic kernels fit a TPU's VMEM (``fits_vmem``: else ``auto`` takes the tiled path).

Shared memory is what limits these kernels (an H200 refused the first ones: 254,208 B asked, 232,448
there). What Triton allocates is known only after it compiles, so ``shared_bytes`` bounds it from
above: a fit to the kernels compiled for sm_90 (``kernel.cubin``), per term set and direction,
``a·S·H·b + c·S·H·4 + d·S²·4 + 4 KiB`` (S block, H head dim, b the inputs' bytes an element), plus
two tiles of keys and values a pipeline stage beyond the first. Before Hopper (sm_80: mma instead
of wgmma, other shared layouts) the backward with a band (txl, Shaw) took up to 1.39 times that
(``PRE_HOPPER``). ``tests/attention/kernel/kernel_cubin_test.py`` compiles every kernel and checks
the bound, and that what this module picks fits sm_90 and sm_80.

Pipeline stages: one where a kernel has a relative term. Triton's software pipeliner issues a loop's
loads an iteration ahead and does not order them after the stores of the iteration they belong to,
so with two stages ``skew``'s read-back of its scratch buffer ran before the store it must see (the
first tile read uninitialised memory, the others the previous tile's). One stage also halves the
shared memory. The forward kernels without one (RoPE, absolute, none; FIRE) keep two, which prefetch
the next keys and values; the backward kernels take one (a second stage added no prefetch there:
the same shared memory, within 256 B, in every compiled backward kernel).
"""

from __future__ import annotations

from relpos_jax.ops import backend

BLOCKS = (64, 32, 16)  # the block sizes tried on a GPU, largest first
STAGES_SKEWED, STAGES_PLAIN = 1, 2
CONSTANT = 4096
PRE_HOPPER = 1.4  # the backward's bound with a band (txl, Shaw) before compute capability 9.0
# (a, c, d) of the bound, forward and backward, by the kernel's terms (``Spec``'s band, values,
# bias, tile: a term evaluated in each tile, measured with FIRE's of 32 hidden units); fit to the
# compiled kernels at S 32 and 64, H 16 to 128, bfloat16 and float32
_COEFFICIENTS = {
    (): ((3.0, 0.0, 0.0), (6.0, 0.0, 1.0)),
    ("band",): ((3.25, 1.0, 1.75), (5.0, 2.0, 2.0)),
    ("band", "values"): ((2.0, 2.0, 2.0), (3.0, 4.0, 2.0)),
    ("bias",): ((2.0, 0.0, 2.25), (5.0, 0.0, 2.0)),
    ("tile",): ((2.5, 0.0, 1.0), (6.0, 0.0, 0.75)),
}
TERMS = ("band", "values", "bias", "tile")  # a kernel's relative terms, in this order


def terms_of(band: bool, values: bool, bias: bool, tile: bool) -> tuple[str, ...]:
    """The names of the terms present (``_COEFFICIENTS``' keys)."""
    return tuple(
        name for name, there in zip(TERMS, (band, values, bias, tile), strict=True) if there
    )


def stages(terms: tuple[str, ...], backward: bool) -> int:
    """Pipeline stages: one in the backward and where ``skew``'s scratch buffer is read back (see
    the docstring)."""
    return STAGES_SKEWED if backward or {"band", "values", "bias"} & set(terms) else STAGES_PLAIN


def warps(block: int) -> int:
    """Warps a program: 8 from block 32 (at 4 the backward spilled 1.7 KB a thread at block 64,
    head dim 64; 0.4 KB at 8), 4 below."""
    return 8 if block >= 32 else 4


def shared_bytes(terms: tuple[str, ...], block: int, head_dim: int, itemsize: int,
                 backward: bool, capability: int = 90) -> int:  # fmt: skip
    """An upper bound of the shared memory a kernel with these terms takes a block on a GPU of
    ``capability``. A term set no scheme has (several relative terms at once) is bounded by the
    sum of its terms' bounds."""
    sets = [terms] if terms in _COEFFICIENTS else [(t,) if t != "values" else ("band", "values")
                                                   for t in terms]  # fmt: skip
    s, h = block, head_dim
    total = CONSTANT
    for key in sets:
        a, c, d = _COEFFICIENTS[key][backward]
        total += int(a * s * h * itemsize + c * s * h * 4 + d * s * s * 4)
    if backward and capability < 90 and "band" in terms:
        total = int(total * PRE_HOPPER)
    return total + (stages(terms, backward) - 1) * 2 * s * h * itemsize


def fits(terms: tuple[str, ...], block: int, head_dim: int, itemsize: int,
         capability: int = 90) -> bool:  # fmt: skip
    """Whether both kernels (forward and backward) fit the shared memory of a GPU of
    ``capability``."""
    capacity = backend.gpu_shared_memory(capability)
    return all(
        shared_bytes(terms, block, head_dim, itemsize, backward, capability) <= capacity
        for backward in (False, True)
    )


def block(terms: tuple[str, ...], head_dim: int, itemsize: int, capability: int | None = None):
    """The largest of ``BLOCKS`` whose kernels fit a GPU of ``capability`` (default: the target's,
    else 9.0); None if none does."""
    capability = capability or backend.gpu_capability() or 90
    return next((s for s in BLOCKS if fits(terms, s, head_dim, itemsize, capability)), None)


def oversized(terms: tuple[str, ...], requested: int, head_dim: int, itemsize: int):
    """``(capacity, fitting block)`` where the kernels of block ``requested`` do not fit the target
    GPU's shared memory (``capacity`` bytes a block; the largest block that fits, at least 16); None
    where they do."""
    capability = backend.gpu_capability() or 90
    if fits(terms, requested, head_dim, itemsize, capability):
        return None
    fitting = block(terms, head_dim, itemsize, capability) or BLOCKS[-1]
    return backend.gpu_shared_memory(capability), fitting


# ---------------------------------------------------------------------------------------- TPU

LANES, SUBLANES = 128, 8
TABLE_WIDTH = {"band": None, "values": None, "bias": 16}  # lanes a row; None: the head dim


def mosaic_vmem_bytes(terms: tuple[str, ...], queries: int, keys: int, head_dim: int,
                      itemsize: int, block: int = 128) -> int:  # fmt: skip
    """An upper bound of the VMEM the Mosaic backward kernel (the larger of the two) takes: every
    block double-buffered (Pallas' pipeline), the last dimension padded to 128 lanes. Each program
    holds its batch row and head's whole window and segment (``kernel.backward.call``): keys and
    values, the queries, the band query and the output gradient, the log-sum-exp and ``Σ dO·O``
    (one lane each, padded), the tables by distance and their gradients."""
    up = lambda x, m: -(-x // m) * m  # noqa: E731
    t, k, h = up(queries, block), up(keys, block), up(head_dim, LANES)
    rows = keys + 4 * block + SUBLANES
    tables = sum(  # by distance; a tile term is one row of parameters
        (SUBLANES * LANES if term == "tile" else rows * up(TABLE_WIDTH[term] or head_dim, LANES))
        * 4
        for term in terms
    )
    inputs = (
        t * h * itemsize * (2 + ("band" in terms))  # q, dO, a
        + 2 * k * h * itemsize  # k, v
        + 2 * t * LANES * 4  # lse, Σ dO·O
        + SUBLANES * k * 4  # which keys are valid
        + tables
    )
    outputs = 4 * block * h * 4 + tables  # dq, da, dk, dv blocks; the tables' gradients
    return 2 * (inputs + outputs)


def fits_vmem(terms: tuple[str, ...], queries: int, keys: int, head_dim: int, itemsize: int,
              capacity: int) -> bool:  # fmt: skip
    """Whether the kernels fit three quarters of ``capacity`` bytes of VMEM (what they ask of
    Mosaic: ``launch.vmem_limit``)."""
    return mosaic_vmem_bytes(terms, queries, keys, head_dim, itemsize) <= capacity * 3 // 4
