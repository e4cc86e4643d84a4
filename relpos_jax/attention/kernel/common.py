"""What the forward and backward kernels share: the static spec of a call, the scoring of one
tile (content product, Toeplitz terms through ``skew``, the mask, dropout) and the ranges of tiles
a block visits.

Inside a kernel the window is laid out ``[S, H]`` per block: S queries or keys of one batch row
and head. Query i and key j (indices in the padded segment and window) are ``offset + i − j``
apart (contiguous positions: the model's windows, with ``offset`` = memory). The per-distance
tables arrive descending and padded (``rows``): row x holds distance ``top − x``, ``top = R − 1 +
2S``, so that a tile at offset ``δ`` reads the ``2S`` rows from ``x0 = R − 1 + S − δ``, the
distances ``δ + S`` down to ``δ − S + 1`` (``skew``'s columns).

Legend: S block size (queries and keys), H head dim, R distances a table covers, W bias width.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from relpos_jax.attention.kernel import skew as skew_lib

F32 = jnp.float32
NEG = float(jnp.finfo(F32).min)
BIAS_WIDTH = 16  # a bias table's rows: the bias in lane 0 (the narrowest product Triton takes)


class TileTerm:
    """A term that a scheme evaluates inside each tile, where it is no table by distance (it
    depends on the query's position too: FIRE's normaliser), from one float32 row of ``WIDTH``
    lanes per head that the scheme packs from its parameters. Part of ``Spec``, so hashable (a
    frozen dataclass). The kernels call ``bias`` for a tile's ``[S, S]`` logits term and, in the
    backward, ``gradient`` for the row's ``[1, WIDTH]`` gradient from the tile's logit gradient
    ``ds``; the packing's own vjp carries it to the scheme's parameters."""

    WIDTH = 128

    def bias(self, spec: Spec, ref, delta, q_block) -> jax.Array:
        """The ``[S, S]`` term of the tile at offset ``δ`` (``distance``) of query block
        ``q_block``; ``ref`` the head's row."""
        raise NotImplementedError

    def gradient(self, spec: Spec, ref, delta, q_block, ds) -> jax.Array:
        """``[1, WIDTH]``: the gradient of the head's row from the tile's ``ds [S, S]``."""
        raise NotImplementedError


class Spec(NamedTuple):
    """The static part of one kernel call."""

    backend: str  # "triton" or "mosaic"
    block: int  # S
    offset: int  # query index − key index at distance 0 (the memory length)
    scale: float
    max_distance: int | None  # same_length: keys at most this far back
    rate: float  # attention dropout
    band: bool  # a logit table with a query side: a_i · w_{i−j} (txl, Shaw's keys)
    bias: bool  # a bias table b_{i−j} per head (T5, ALiBi, KERPLE)
    values: bool  # a value table: Σ_j p_ij w_{i−j} (Shaw's values)
    distances: int  # R
    batch: int
    heads: int
    q_blocks: int
    k_blocks: int
    interpret: bool = False
    tile: TileTerm | None = None  # a term the scheme evaluates in each tile (FIRE's), if any


def dot(x, y):
    """``[M, C] · [C, N]`` -> ``[M, N]`` float32."""
    return jax.lax.dot_general(x, y, (((1,), (0,)), ((), ())), preferred_element_type=F32)


def dot_nt(x, y):
    """``[M, C] · [N, C]ᵀ`` -> ``[M, N]`` float32."""
    return jax.lax.dot_general(x, y, (((1,), (1,)), ((), ())), preferred_element_type=F32)


def dot_tn(x, y):
    """``[C, M]ᵀ · [C, N]`` -> ``[M, N]`` float32."""
    return dot(jnp.transpose(x), y)


def first_row(spec: Spec, delta):
    """The first of the 2S table rows of a tile at offset ``δ``."""
    return jnp.clip(spec.distances - 1 + spec.block - delta, 0, spec.distances + 2 * spec.block)


def unit_query(spec: Spec) -> jax.Array:
    """``[S, W]``: 1 in lane 0, the query side that reads a bias table as a band."""
    lanes = jax.lax.broadcasted_iota(jnp.int32, (spec.block, BIAS_WIDTH), 1)
    return (lanes == 0).astype(F32)


# Mosaic reads and writes rows at multiples of this; tables carry as many more rows
SUBLANES = skew_lib.SUBLANES


def rows_of(spec: Spec, ref, x0) -> jax.Array:
    """The ``2S`` table rows from ``x0``: on Mosaic, the aligned rows around them rotated into
    place (a dynamic row offset off the 8-row tiling is not a plain load there)."""
    count = 2 * spec.block
    if spec.backend == "triton":
        return ref[pl.ds(x0, count), :]
    base, off, width = _aligned(x0, count)
    window = ref[pl.ds(base, width), :].astype(F32)
    return pltpu.roll(window, jax.lax.rem(width - off, jnp.int32(width)), 0)[:count]


def add_rows(spec: Spec, ref, x0, value) -> None:
    """``ref[x0 : x0 + rows] += value`` on Mosaic (the aligned rows around them)."""
    base, off, width = _aligned(x0, value.shape[0])
    padded = jnp.concatenate([value, jnp.zeros((width - value.shape[0], value.shape[1]), F32)])
    ref[pl.ds(base, width), :] += pltpu.roll(padded, off, 0)


def _aligned(x0, count: int):
    """``(base, off, width)``: ``x0 = base + off``, ``base`` a multiple of ``SUBLANES``, and the
    ``width = count + SUBLANES`` rows from ``base`` cover the ``count`` from ``x0``."""
    off = jax.lax.rem(x0, jnp.int32(SUBLANES))
    return pl.multiple_of(x0 - off, SUBLANES), off, count + SUBLANES


def logits(spec: Spec, skew: skew_lib.Skew, q, a, k, rows_ref, bias_ref, delta):
    """``[S, S]`` float32 logits of a tile at offset ``δ`` (before the mask)."""
    s = spec.scale * dot_nt(q, k)
    x0 = first_row(spec, delta)
    if spec.band:
        s = s + skew.band(dot_nt(a, rows_of(spec, rows_ref, x0).astype(a.dtype)))
    if spec.bias:
        s = s + skew.band(dot_nt(unit_query(spec), rows_of(spec, bias_ref, x0)))
    return s


def distance(spec: Spec, delta) -> jax.Array:
    """``[S, S]``: ``δ + i − j``."""
    shape = (spec.block, spec.block)
    i = jax.lax.broadcasted_iota(jnp.int32, shape, 0)
    j = jax.lax.broadcasted_iota(jnp.int32, shape, 1)
    return delta + i - j


def allowed(spec: Spec, delta, valid_row) -> jax.Array:
    """``[S, S]`` bool: causal, within same_length's reach, and a valid key (``valid_row [1, S]``)."""
    d = distance(spec, delta)
    ok = (d >= 0) & (valid_row != 0)
    if spec.max_distance is not None:
        ok = ok & (d <= spec.max_distance)
    return ok


def kept(spec: Spec, seed, row, q_block, k_block) -> jax.Array:
    """``[S, S]`` bool: the weights dropout keeps in tile (q_block, k_block) of ``row = b·N + n``."""
    shape = (spec.block, spec.block)
    queries = q_block * spec.block + jax.lax.broadcasted_iota(jnp.int32, shape, 0)
    keys = k_block * spec.block + jax.lax.broadcasted_iota(jnp.int32, shape, 1)
    return skew_lib.keep(seed, row, queries, keys, spec.rate)


def _div(x, size: int):
    """``x // size`` of a non-negative traced int (truncating: no sign, which Mosaic lowers only
    for a known TPU)."""
    return jax.lax.div(x, jnp.int32(size))


def key_range(spec: Spec, i):
    """The key blocks ``[lo, hi)`` query block i may attend (causal; same_length's reach)."""
    s = spec.block
    hi = jnp.minimum(spec.k_blocks, _div(spec.offset + i * s + s - 1, s) + 1)
    if spec.max_distance is None:
        return jnp.int32(0), hi
    return _div(jnp.maximum(spec.offset + i * s - spec.max_distance, 0), s), hi


def query_range(spec: Spec, t):
    """The query blocks ``[lo, hi)`` that may attend key block t."""
    s = spec.block
    lo = _div(jnp.maximum(t * s - spec.offset, 0), s)
    if spec.max_distance is None:
        return lo, jnp.int32(spec.q_blocks)
    last = t * s + s - 1 + spec.max_distance - spec.offset  # the last query index in reach
    return lo, jnp.minimum(spec.q_blocks, _div(jnp.maximum(last, -1) + s, s))
