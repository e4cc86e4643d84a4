"""FIRE's bias inside a kernel tile: ``b(i, j) = f(ψ(d)/ψ(max(L, i)))``, ``ψ(x) = log(1 + c·x)``,
``f(x) = Σ_h w2_h·relu(w1_h·x + b1_h) + b2`` (one head's output of the scheme's MLP; ``i`` the
query's position). Not a table by distance (the normaliser depends on the query), so each tile
evaluates it, and its gradient, element by element.

A head's parameters arrive as one float32 row ``[1, 128]`` (``pack``): ``c, L``, the first query's
position, ``b2``, then the hidden units' ``w1``, ``b1`` and ``w2``; the backward kernel returns
the gradient of that row, and the packing's own vjp carries it to the scheme's parameters. The
hidden units are a loop in the kernel (``fori_loop``), not a copy of the body per unit: unrolled,
Triton took 3 minutes to compile each kernel and spilled 14–30 KB a thread.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from relpos_jax.attention.kernel import common
from relpos_jax.attention.kernel.common import F32, Spec

WIDTH = 128
C, L, FIRST, B2, HIDDEN_AT = 0, 1, 2, 3, 4


def hidden_units(spec: Spec) -> int:
    return spec.fire


def pack(c, threshold, first_query, w1, b1, w2_HN, b2_N) -> jax.Array:
    """``[N, 1, WIDTH]`` rows of the heads' parameters (``c`` and ``L`` already positive)."""
    heads, hidden = b2_N.shape[0], w1.shape[0]
    if HIDDEN_AT + 3 * hidden > WIDTH:
        raise ValueError(f"kernel FIRE: {hidden} hidden units do not fit a row of {WIDTH}")
    shared = jnp.stack([c, threshold, first_query]).astype(F32)
    rows = [
        jnp.broadcast_to(shared, (heads, 3)), b2_N[:, None].astype(F32),
        jnp.broadcast_to(w1.astype(F32), (heads, hidden)),
        jnp.broadcast_to(b1.astype(F32), (heads, hidden)), w2_HN.T.astype(F32),
    ]  # fmt: skip
    row = jnp.concatenate(rows, axis=1)
    return jnp.pad(row, ((0, 0), (0, WIDTH - row.shape[1])))[:, None, :]


def _at(ref, lane: int):
    """Lane ``lane`` of the row, ``[1, 1]`` (broadcasts over a tile)."""
    return ref[:, lane : lane + 1]


def _inputs(spec: Spec, ref, delta, q_block):
    """``x = ψ(d)/ψ(max(L, i))`` ``[S, S]`` and what its gradient needs."""
    c, threshold = _at(ref, C), _at(ref, L)
    shape = (spec.block, spec.block)
    query = q_block * spec.block + jax.lax.broadcasted_iota(jnp.int32, shape, 0)
    position = _at(ref, FIRST) + query.astype(F32)
    distance = jnp.maximum(common.distance(spec, delta), 0).astype(F32)
    reach = jnp.maximum(threshold, position)
    u, r = jnp.log(1.0 + c * distance), jnp.log(1.0 + c * reach)
    return u / r, (c, threshold, position, distance, reach, u, r)


def _unit(spec: Spec, ref, h):
    """Hidden unit ``h``'s ``(w1, b1, w2)``, each ``[1, 1]``: a traced ``h`` (the loop over units
    is a loop in the kernel, not one copy of its body per unit) picks its lanes by a masked sum."""
    n = hidden_units(spec)
    row = ref[...]
    lanes = jax.lax.broadcasted_iota(jnp.int32, row.shape, 1)

    def pick(k: int) -> jax.Array:
        return jnp.sum(jnp.where(lanes == HIDDEN_AT + k * n + h, row, 0.0), 1, keepdims=True)

    return pick(0), pick(1), pick(2)


def bias(spec: Spec, ref, delta, q_block) -> jax.Array:
    """FIRE's ``[S, S]`` bias of a tile at offset ``δ`` of query block ``q_block``."""
    x, _ = _inputs(spec, ref, delta, q_block)

    def unit(h, out):
        w1, b1, w2 = _unit(spec, ref, h)
        return out + w2 * jnp.maximum(w1 * x + b1, 0.0)

    return jax.lax.fori_loop(0, hidden_units(spec), unit, jnp.zeros_like(x) + _at(ref, B2))


def gradient(spec: Spec, ref, delta, q_block, ds) -> jax.Array:
    """``[1, WIDTH]``: the gradient of the row from the tile's logit gradient ``ds``."""
    x, (c, threshold, position, distance, reach, u, r) = _inputs(spec, ref, delta, q_block)
    lanes = jax.lax.broadcasted_iota(jnp.int32, (1, WIDTH), 1)
    total = lambda y: jnp.sum(y, axis=(0, 1), keepdims=True)  # noqa: E731
    out = jnp.where(lanes == B2, total(ds), 0.0)
    n = hidden_units(spec)

    def unit(h, carry):
        out, dx = carry
        w1, b1, w2 = _unit(spec, ref, h)
        z = w1 * x + b1
        g = jnp.where(z > 0, ds * w2, 0.0)
        for k, value in enumerate((total(g * x), total(g), total(ds * jnp.maximum(z, 0.0)))):
            out = out + jnp.where(lanes == HIDDEN_AT + k * n + h, value, 0.0)
        return out, dx + g * w1

    out, dx = jax.lax.fori_loop(0, n, unit, (out, jnp.zeros_like(x)))
    # x = u / r: u = ψ(d), r = ψ(max(L, i))
    dr = -dx * u / (r * r)
    d_c = dx * distance / ((1.0 + c * distance) * r) + dr * reach / (1.0 + c * reach)
    d_threshold = jnp.where(threshold > position, dr * c / (1.0 + c * reach), 0.0)
    out = out + jnp.where(lanes == C, total(d_c), 0.0)
    return out + jnp.where(lanes == L, total(d_threshold), 0.0)
