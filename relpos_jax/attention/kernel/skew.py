"""The relative shift inside a kernel tile, and attention dropout drawn from a counter.

A tile of S queries against S keys whose first query and first key are ``δ`` apart spans the
distances ``δ − S + 1 … δ + S − 1``. A Toeplitz term is scored once per distance, as products
``P [S, 2S]`` whose column ``c`` holds distance ``δ + S − c``; then

* ``band(P) [S, S]``: ``M[i, j] = P[i, S − i + j]`` (the pair's distance ``δ + i − j``), the fast
  relative shift of Transformer-XL, one tile at a time;
* ``spread(M) [S, 2S]``: its transpose, ``out[i, S − i + j] = M[i, j]`` and 0 elsewhere, which
  sums a tile's pairs by distance (the value side, and every per-distance gradient).

Mosaic (TPU) does both with a strided rotation of the rows (``pltpu.roll``: row i rotated by
``shift + i·stride``, the stride at most a few lanes, v5 and later): ``band`` rotates row i by
``i − S`` (stride +1); ``spread``, its inverse, by ``S − i``, a stride of −1 that Mosaic cannot
take, so it rotates the rows reversed (row ``S − 1 − i`` by ``1 + i``) and reverses them back, each
reversal a gather within every 8-row vreg and the vregs taken in reverse order. Triton has no such
op on values: the products go through a per-program scratch buffer in global memory, written and
read back at skewed addresses, a barrier between the two. The reads are volatile (never served from
a stale copy) and the kernels that have them run one pipeline stage (``kernel.fit.stages``): with
two, Triton's pipeliner issued them an iteration ahead, before the store they must see.
``kernel.cubin`` finds any volatile read turned into an asynchronous copy.

Dropout (``keep``) is a counter-based hash of (seed, batch row, head, query, key): the same mask in
the forward and the backward kernels, and in the float64 reference, with no mask stored.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax.experimental.pallas import tpu as pltpu
from jax.experimental.pallas import triton as pltriton

BACKENDS = ("triton", "mosaic")
SUBLANES = 8  # the rows of a Mosaic vreg


class Skew:
    """``band`` and ``spread`` for one backend; ``scratch`` is Triton's ``[S, 2S]`` float32 ref
    (None for Mosaic); ``interpret``: no barriers (Pallas' interpreter runs a program serially)."""

    def __init__(self, backend: str, size: int, scratch=None, interpret: bool = False):
        self.backend, self.size, self.scratch, self.interpret = backend, size, scratch, interpret

    def _barrier(self):
        if not self.interpret:
            pltriton.debug_barrier()

    def _read(self, rows, cols):
        if self.interpret:
            return self.scratch[rows, cols]
        return pltriton.load(self.scratch.at[rows, cols], volatile=True)

    def _rows_cols(self, width: int):
        rows = jax.lax.broadcasted_iota(jnp.int32, (self.size, width), 0)
        cols = jax.lax.broadcasted_iota(jnp.int32, (self.size, width), 1)
        return rows, cols

    def band(self, p: jax.Array) -> jax.Array:
        """``[S, 2S]`` products by distance -> ``[S, S]`` logits: ``M[i, j] = P[i, S − i + j]``."""
        s = self.size
        if self.backend == "mosaic":
            return pltpu.roll(p, s, 1, stride=1, stride_axis=0)[:, :s]
        rows, cols = self._rows_cols(s)
        self.scratch[...] = p
        self._barrier()
        m = self._read(rows, s - rows + cols)
        self._barrier()
        return m

    def spread(self, m: jax.Array) -> jax.Array:
        """``[S, S]`` -> ``[S, 2S]``: ``out[i, S − i + j] = M[i, j]``, zeros elsewhere."""
        s = self.size
        m = m.astype(jnp.float32)
        if self.backend == "mosaic":
            padded = jnp.concatenate([m, jnp.zeros_like(m)], axis=1)
            rotated = pltpu.roll(_reverse_rows(padded), 1, 1, stride=1, stride_axis=0)
            return _reverse_rows(rotated)
        rows, cols = self._rows_cols(2 * s)
        j = cols - s + rows
        inside = (j >= 0) & (j < s)
        self.scratch[:, :s] = m
        self._barrier()
        out = self._read(rows, jnp.clip(j, 0, s - 1))
        self._barrier()
        return jnp.where(inside, out, 0.0)


def _reverse_rows(x: jax.Array) -> jax.Array:
    """``x[::-1]`` as Mosaic lowers it (it has no ``rev``, and gathers only within a vreg): each
    group of ``SUBLANES`` rows reversed by a gather, the groups concatenated in reverse order."""
    rows = jax.lax.broadcasted_iota(jnp.int32, (SUBLANES, x.shape[1]), 0)
    groups = [
        jnp.take_along_axis(x[r : r + SUBLANES], SUBLANES - 1 - rows, 0, mode="promise_in_bounds")
        for r in range(0, x.shape[0], SUBLANES)
    ]
    return jnp.concatenate(groups[::-1], axis=0)


def _mix(x: jax.Array) -> jax.Array:
    """A 32-bit integer hash (the ``lowbias32`` finaliser), on uint32."""
    x = x ^ (x >> 16)
    x = x * jnp.uint32(0x7FEB352D)
    x = x ^ (x >> 15)
    x = x * jnp.uint32(0x846CA68B)
    return x ^ (x >> 16)


def keep(seed, row, queries: jax.Array, keys: jax.Array, rate: float) -> jax.Array:
    """Whether dropout keeps the weight of (query, key) of batch-and-head ``row`` (``row = b·N +
    n``), ``queries [I, 1]`` and ``keys [1, J]`` global indices: a hash of all four, uniform in
    [0, 2³²), kept where it is at least ``rate·2³²``."""
    u32 = lambda x: jnp.asarray(x).astype(jnp.uint32)  # noqa: E731
    h = _mix(u32(seed) ^ _mix(u32(row) + jnp.uint32(0x9E3779B9)))
    h = _mix(h ^ u32(queries) * jnp.uint32(0x85EBCA6B))
    h = _mix(h ^ u32(keys) * jnp.uint32(0xC2B2AE35))
    threshold = min(round(rate * 2.0**32), 2**32 - 1)
    return h >= jnp.uint32(threshold)
