"""The forward kernel: FlashAttention-2's online softmax over key blocks, one program per (batch
row, head, query block), with the Toeplitz terms of ``common`` scored per tile. Saves the
log-sum-exp per query for the backward kernel; nothing of size T·K exists.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl

from relpos_jax.attention.kernel import common, launch
from relpos_jax.attention.kernel.common import F32, NEG, Spec
from relpos_jax.attention.kernel.skew import Skew


def _unpack(spec: Spec, refs):
    """The kernel's refs by name (the optional ones None)."""
    refs = list(refs)
    take = lambda present: refs.pop(0) if present else None  # noqa: E731
    names = {}
    names["q"], names["a"] = refs.pop(0), take(spec.band)
    names["k"], names["v"], names["valid"] = refs.pop(0), refs.pop(0), refs.pop(0)
    for name, present in (("rows", spec.band), ("bias", spec.bias), ("vrows", spec.values),
                          ("tile", spec.tile is not None)):  # fmt: skip
        names[name] = take(present)
    names["seed"], names["out"], names["lse"] = refs.pop(0), refs.pop(0), refs.pop(0)
    names["scratch"] = take(spec.backend == "triton")
    return names


def kernel(spec: Spec, *refs):
    r = _unpack(spec, refs)
    b, n, i = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    s = spec.block
    skew = Skew(spec.backend, s, r["scratch"], spec.interpret)
    q = r["q"][...]
    a = None if r["a"] is None else r["a"][...]
    head_dim = q.shape[-1]

    def body(t, carry):
        m, l, acc = carry
        delta = spec.offset + (i - t) * s
        keys = pl.ds(pl.multiple_of(t * s, s), s)
        k, v = r["k"][keys, :], r["v"][keys, :]
        logits = common.logits(spec, skew, q, a, k, r["rows"], r["bias"], delta)
        if spec.tile is not None:
            logits = logits + spec.tile.bias(spec, r["tile"], delta, i)
        ok = common.allowed(spec, delta, r["valid"][:, keys])
        logits = jnp.where(ok, logits, NEG)
        m_new = jnp.maximum(m, logits.max(axis=1, keepdims=True))
        alpha = jnp.exp(m - m_new)
        e = jnp.where(ok, jnp.exp(logits - m_new), 0.0)
        l = alpha * l + e.sum(axis=1, keepdims=True)
        if spec.rate:
            kept = common.kept(spec, r["seed"][...], b * spec.heads + n, i, t)
            e = jnp.where(kept, e * (1.0 / (1.0 - spec.rate)), 0.0)
        acc = alpha * acc + common.dot(e.astype(v.dtype), v)
        if spec.values:
            rows = common.rows_of(spec, r["vrows"], common.first_row(spec, delta))
            acc = acc + common.dot(skew.spread(e), rows.astype(F32))
        return m_new, l, acc

    lo, hi = common.key_range(spec, i)
    init = (jnp.full((s, 1), NEG, F32), jnp.zeros((s, 1), F32), jnp.zeros((s, head_dim), F32))
    m, l, acc = jax.lax.fori_loop(lo, hi, body, init)
    some = l > 0.0  # a query with no allowed key: out 0, lse NEG
    l_safe = jnp.where(some, l, 1.0)
    r["out"][...] = (acc / l_safe).astype(r["out"].dtype)
    r["lse"][...] = jnp.where(some, m + jnp.log(l_safe), NEG)


def call(spec: Spec, q, a, k, v, valid, rows, bias, vrows, tile_rows, seed):
    """``(out [B, N, Tp, H], lse [B, N, Tp, 1] float32)`` of padded, head-major inputs."""
    batch, heads, q_len, head_dim = q.shape
    s = spec.block
    q_block = pl.BlockSpec((None, None, s, head_dim), lambda b, n, i: (b, n, i, 0))
    window = pl.BlockSpec((None, None, k.shape[2], head_dim), lambda b, n, i: (b, n, 0, 0))
    inputs, specs = [q], [q_block]
    if spec.band:
        inputs, specs = [*inputs, a], [*specs, q_block]
    inputs += [k, v, valid]
    specs += [window, window, launch.whole(valid.shape)]
    tables = ((spec.band, rows), (spec.bias, bias), (spec.values, vrows),
              (spec.tile is not None, tile_rows))  # fmt: skip
    for present, table in tables:
        if present:
            inputs.append(table)
            specs.append(launch.table(table, heads, head_axis=1))
    inputs.append(seed)
    specs.append(launch.whole(seed.shape))
    outputs = [
        (jax.ShapeDtypeStruct(q.shape, q.dtype), q_block),
        (
            jax.ShapeDtypeStruct((batch, heads, q_len, 1), F32),
            pl.BlockSpec((None, None, s, 1), lambda b, n, i: (b, n, i, 0)),
        ),
    ]
    if spec.backend == "triton":
        outputs.append(launch.scratch(spec, (batch, heads, spec.q_blocks)))
    out = launch.pallas(
        spec, functools.partial(kernel, spec), (batch, heads, spec.q_blocks), inputs, specs,
        outputs, parallel=True,
    )  # fmt: skip
    return out[0], out[1]
