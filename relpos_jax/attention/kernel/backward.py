"""The backward kernel: one program per (head, batch row, block g) with blocks of S queries and S
keys, recomputing each tile's weights from the saved log-sum-exp (FlashAttention-2):

* over the query blocks that may attend key block g: ``dk_g``, ``dv_g``;
* over the key blocks query block g may attend: ``dq_g``, the band query's ``da_g``, and the
  per-distance gradients of the tables (``spread`` of the tile's ``ds`` or weights, by distance),
  added into one ``[Rp, C]`` buffer per table: Triton with atomic adds, Mosaic in the output block
  that stays in VMEM across the grid (every axis ``arbitrary``; zeroed at its first program).

Nothing of size T·K exists; each tile is recomputed twice.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as pltriton

from relpos_jax.attention.kernel import common, launch
from relpos_jax.attention.kernel.common import F32, Spec
from relpos_jax.attention.kernel.skew import Skew

TABLES = ("d_rows", "d_bias", "d_vrows", "d_tile")


def _unpack(spec: Spec, refs):
    refs = list(refs)
    take = lambda present: refs.pop(0) if present else None  # noqa: E731
    r = {"q": refs.pop(0), "a": take(spec.band)}
    r["k"], r["v"], r["valid"] = refs.pop(0), refs.pop(0), refs.pop(0)
    r["rows"], r["bias"], r["vrows"] = take(spec.band), take(spec.bias), take(spec.values)
    r["tile"] = take(spec.tile is not None)
    r["seed"], r["do"], r["lse"], r["d"] = (refs.pop(0) for _ in range(4))
    present = _present(spec)
    if spec.backend == "triton":  # the zeroed tables the outputs alias
        for _ in range(sum(present)):
            refs.pop(0)
    r["dq"], r["da"] = refs.pop(0), take(spec.band)
    r["dk"], r["dv"] = refs.pop(0), refs.pop(0)
    for name, there in zip(TABLES, present, strict=True):
        r[name] = take(there)
    r["scratch"] = take(spec.backend == "triton")
    return r


def _present(spec: Spec) -> tuple[bool, ...]:
    """Which of ``TABLES`` the call has."""
    return bool(spec.band), bool(spec.bias), bool(spec.values), spec.tile is not None


def _accumulate(spec: Spec, ref, x0, value):
    """``ref[x0 : x0 + rows] += value`` (``x0`` None: the whole ``ref``): atomically on Triton
    (programs run at once)."""
    if spec.backend == "triton":
        start = jnp.int32(0) if x0 is None else jnp.asarray(x0, jnp.int32)  # (int32 under x64)
        rows, columns = pl.ds(start, value.shape[0]), pl.ds(jnp.int32(0), ref.shape[1])
        pltriton.atomic_add(ref, (rows, columns), value)
    elif x0 is None:
        ref[...] += value
    else:
        common.add_rows(spec, ref, x0, value)


def kernel(spec: Spec, per_head: dict[str, bool], *refs):
    r = _unpack(spec, refs)
    n, b, g = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    s, row = spec.block, b * spec.heads + n
    skew = Skew(spec.backend, s, r["scratch"], spec.interpret)
    block = lambda x: pl.ds(pl.multiple_of(x * s, s), s)  # noqa: E731

    if spec.backend == "mosaic":
        for name in TABLES:
            if r[name] is not None:
                # its first program: the first of its head's, or of all when the heads share it
                first = (b == 0) & (g == 0) & ((n == 0) | per_head[name])
                ref = r[name]

                @pl.when(first)
                def _zero(ref=ref):
                    ref[...] = jnp.zeros(ref.shape, ref.dtype)

    def queries(i):
        rows = block(i)
        a = None if r["a"] is None else r["a"][rows, :]
        return r["q"][rows, :], a, r["do"][rows, :], r["lse"][rows, :], r["d"][rows, :]

    def tile(i, t, q_i, a_i, do_i, lse_i, d_i, k_t, v_t):
        """Tile (i, t): the weights after dropout and ``ds``."""
        delta = spec.offset + (i - t) * s
        logits = common.logits(spec, skew, q_i, a_i, k_t, r["rows"], r["bias"], delta)
        if spec.tile is not None:
            logits = logits + spec.tile.bias(spec, r["tile"], delta, i)
        ok = common.allowed(spec, delta, r["valid"][:, block(t)])
        p = jnp.where(ok, jnp.exp(logits - lse_i), 0.0)
        dp = common.dot_nt(do_i, v_t)
        if spec.values:
            rows = common.rows_of(spec, r["vrows"], common.first_row(spec, delta))
            dp = dp + skew.band(common.dot_nt(do_i, rows.astype(do_i.dtype)))
        if spec.rate:
            kept = common.kept(spec, r["seed"][...], row, i, t)
            factor = 1.0 / (1.0 - spec.rate)
            p_dropped = jnp.where(kept, p * factor, 0.0)
            dp = jnp.where(kept, dp * factor, 0.0)
        else:
            p_dropped = p
        return p_dropped, p * (dp - d_i)

    # dk, dv of key block g
    k_g, v_g = r["k"][block(g), :], r["v"][block(g), :]

    def key_body(i, carry):
        dk, dv = carry
        q_i, a_i, do_i, lse_i, d_i = queries(i)
        p, ds = tile(i, g, q_i, a_i, do_i, lse_i, d_i, k_g, v_g)
        dv = dv + common.dot_tn(p.astype(do_i.dtype), do_i)
        dk = dk + spec.scale * common.dot_tn(ds.astype(q_i.dtype), q_i)
        return dk, dv

    zeros = jnp.zeros(k_g.shape, F32)
    dk, dv = jax.lax.fori_loop(*common.query_range(spec, g), key_body, (zeros, zeros))
    r["dk"][...], r["dv"][...] = dk.astype(r["dk"].dtype), dv.astype(r["dv"].dtype)

    # dq, da and the tables' gradients of query block g
    @pl.when(g < spec.q_blocks)
    def _queries():
        q_g, a_g, do_g, lse_g, d_g = queries(g)

        def query_body(t, carry):
            dq, da = carry
            k_t, v_t = r["k"][block(t), :], r["v"][block(t), :]
            p, ds = tile(g, t, q_g, a_g, do_g, lse_g, d_g, k_t, v_t)
            dq = dq + spec.scale * common.dot(ds.astype(k_t.dtype), k_t)
            x0 = common.first_row(spec, spec.offset + (g - t) * s)
            if spec.band or spec.bias:
                by_distance = skew.spread(ds)
            if spec.band:
                rows = common.rows_of(spec, r["rows"], x0).astype(F32)
                da = da + common.dot(by_distance, rows)
                _accumulate(spec, r["d_rows"], x0, common.dot_tn(by_distance, a_g.astype(F32)))
            if spec.bias:
                _accumulate(
                    spec, r["d_bias"], x0, common.dot_tn(by_distance, common.unit_query(spec))
                )
            if spec.values:
                _accumulate(spec, r["d_vrows"], x0, common.dot_tn(skew.spread(p), do_g.astype(F32)))
            if spec.tile is not None:
                delta = spec.offset + (g - t) * s
                row = spec.tile.gradient(spec, r["tile"], delta, g, ds)
                _accumulate(spec, r["d_tile"], None, row)
            return dq, da

        zeros = jnp.zeros(q_g.shape, F32)
        dq, da = jax.lax.fori_loop(*common.key_range(spec, g), query_body, (zeros, zeros))
        r["dq"][...] = dq.astype(r["dq"].dtype)
        if r["da"] is not None:
            r["da"][...] = da.astype(r["da"].dtype)

    @pl.when(g >= spec.q_blocks)
    def _no_queries():
        r["dq"][...] = jnp.zeros(r["dq"].shape, r["dq"].dtype)
        if r["da"] is not None:
            r["da"][...] = jnp.zeros(r["da"].shape, r["da"].dtype)


def call(spec: Spec, q, a, k, v, valid, rows, bias, vrows, tile_rows, seed, d_out, lse, d_rows_sum):
    """``(dq, da, dk, dv, d_rows, d_bias, d_vrows, d_tile)`` float32 of the padded, head-major inputs
    (``d_rows_sum [B, N, Tp, 1]``: ``Σ_h dO·O``); queries' gradients come ``[B, N, Kp, H]``."""
    batch, heads, q_len, head_dim = q.shape
    k_len, s = k.shape[2], spec.block
    grid = (heads, batch, spec.k_blocks)
    whole = lambda x: pl.BlockSpec((None, None, *x.shape[2:]), lambda n, b, g: (b, n, 0, 0))  # noqa: E731
    own = pl.BlockSpec((None, None, s, head_dim), lambda n, b, g: (b, n, g, 0))
    inputs, specs = [q], [whole(q)]
    if spec.band:
        inputs, specs = [*inputs, a], [*specs, whole(a)]
    inputs += [k, v, valid]
    specs += [whole(k), whole(v), launch.whole(valid.shape)]
    every = (rows, bias, vrows, tile_rows)
    tables = [x for there, x in zip(_present(spec), every, strict=True) if there]
    inputs += tables
    specs += [launch.table(x, heads, head_axis=0) for x in tables]
    inputs += [seed, d_out, lse, d_rows_sum]
    specs += [launch.whole(seed.shape), whole(d_out), whole(lse), whole(d_rows_sum)]
    aliases = {}
    if spec.backend == "triton":  # zeroed gradients of the tables, added into atomically
        first_output = 3 + spec.band  # after dq, da, dk, dv
        for index, x in enumerate(tables):
            aliases[len(inputs)] = first_output + index
            inputs.append(jnp.zeros(x.shape, F32))
            specs.append(launch.table(x, heads, head_axis=0))
    queries = jax.ShapeDtypeStruct((batch, heads, k_len, head_dim), F32)
    outputs = [(queries, own)] * (1 + spec.band) + [(queries, own)] * 2
    outputs += [(jax.ShapeDtypeStruct(x.shape, F32), launch.table(x, heads, 0)) for x in tables]
    if spec.backend == "triton":
        outputs.append(launch.scratch(spec, grid))
    present = [name for name, there in zip(TABLES, _present(spec), strict=True) if there]
    per_head = {name: launch.per_head(x, heads) for name, x in zip(present, tables, strict=True)}
    body = functools.partial(kernel, spec, per_head)
    out = list(launch.pallas(spec, body, grid, inputs, specs, outputs, aliases))
    dq = out.pop(0)[:, :, :q_len]
    da = out.pop(0)[:, :, :q_len] if spec.band else None
    dk, dv = out.pop(0), out.pop(0)
    grads = {}
    for name, there in zip(TABLES, _present(spec), strict=True):
        grads[name] = out.pop(0) if there else None
    return dq, da, dk, dv, grads["d_rows"], grads["d_bias"], grads["d_vrows"], grads["d_tile"]
