"""The tiled attention core (``relpos_jax.attention.tiled.attend``) against its dense reference.

Three callback kinds mimic the real schemes: a T5-like learned bias by bucket of distance, Shaw's
key and value sides, and Transformer-XL's ``u·k + (q + v)·W_R·R(d)`` whose position half a tile
computes from its band of ``I + J − 1`` distances and a local shift. The tiled path (custom VJP,
online softmax) must match the dense one (plain softmax, plain autodiff) in value and gradients of
q, k, v and every params leaf, on memory-like windows: keys at ``arange(K) − (K − T)``, the first
keys invalid, ``max_distance`` set, tiles that do not divide K.
"""

from __future__ import annotations

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from relpos_jax.attention.tiled import attend
from relpos_jax.ops.dropout import keep_mask
from relpos_jax.positions.absolute import sinusoid
from relpos_jax.positions.shaw import shaw_key_logits, shaw_value_output
from relpos_jax.positions.t5 import t5_bucket

B, N, H, D = 2, 2, 4, 8  # D: the sinusoid's width in the Transformer-XL-like term
SCALE = 0.5


# ------------------------------------------------------------------------- the three schemes


def _bias_scheme(rng):
    """T5/ALiBi-like: a learned ``[num_buckets, N]`` table read by the bucket of the distance."""

    def logit_term(prm, q, k, q_pos, k_pos):
        bucket = t5_bucket(
            q_pos[:, None] - k_pos[None, :], bidirectional=False, num_buckets=6, max_distance=9
        )
        return jnp.moveaxis(prm["table"][bucket], -1, 0)[None]  # [1, N, I, J]

    params = {"table": jnp.asarray(rng.normal(size=(6, N)), jnp.float32)}
    return params, logit_term, logit_term, None


def _shaw_scheme(rng):
    """Shaw-like: ``q_i · table_k[clip(d)]`` on the logits, ``Σ_j p_ij table_v[clip(d)]`` on values."""

    def logit_term(prm, q, k, q_pos, k_pos):
        return SCALE * shaw_key_logits(q, prm["table_k"], q_pos, k_pos)

    def value_term(prm, p, q_pos, k_pos):
        return shaw_value_output(p, prm["table_v"], q_pos, k_pos)

    params = {
        name: jnp.asarray(rng.normal(size=(7, H)), jnp.float32) for name in ("table_k", "table_v")
    }
    return params, logit_term, logit_term, value_term


def _txl_content(prm, k):
    return jnp.einsum("nh,bjnh->bnj", prm["u"], k.astype(jnp.float32))[:, :, None, :]


def _txl_band(prm, q, k, q_pos, k_pos):
    """The tile's term from its band: distances of a tile with contiguous positions run from
    ``q_pos[0] − k_pos[-1]`` over ``I + J − 1`` values; project those sinusoids once, score every
    query on them ``[B, N, I, I + J − 1]``, then the local shift: pair (i, j) reads column
    ``i − j + J − 1`` (index arithmetic on i and j only, no positions: it needs contiguity)."""
    i_len, j_len = q_pos.shape[0], k_pos.shape[0]
    band = q_pos[0] - k_pos[-1] + jnp.arange(i_len + j_len - 1)
    r_RNH = jnp.einsum("rd,dnh->rnh", sinusoid(band, D), prm["w_r"])
    scores = jnp.einsum("binh,rnh->bnir", q.astype(jnp.float32) + prm["v"], r_RNH)
    shift = np.arange(i_len)[:, None] - np.arange(j_len)[None, :] + j_len - 1
    position = jnp.take_along_axis(scores, jnp.asarray(shift)[None, None], axis=-1)
    return SCALE * (position + _txl_content(prm, k))


def _txl_per_pair(prm, q, k, q_pos, k_pos):
    """The same term with one sinusoid per (i, j) pair: ``[I, J, N, H]`` (the dense definition)."""
    r_IJNH = jnp.einsum("ijd,dnh->ijnh", sinusoid(q_pos[:, None] - k_pos[None, :], D), prm["w_r"])
    position = jnp.einsum("binh,ijnh->bnij", q.astype(jnp.float32) + prm["v"], r_IJNH)
    return SCALE * (position + _txl_content(prm, k))


def _txl_scheme(rng):
    params = {
        "w_r": jnp.asarray(rng.normal(size=(D, N, H)) / np.sqrt(D), jnp.float32),
        "u": jnp.asarray(rng.normal(size=(N, H)), jnp.float32),
        "v": jnp.asarray(rng.normal(size=(N, H)), jnp.float32),
    }
    return params, _txl_band, _txl_per_pair, None


SCHEMES = {"bias": _bias_scheme, "shaw": _shaw_scheme, "txl": _txl_scheme}


# ----------------------------------------------------------------------------------- helpers


def _window(rng, q_len, k_len, *, invalid=0, dtype=jnp.float32):
    """q, k, v and memory-like positions: the queries are the last T positions of the window."""
    q, k, v = (jnp.asarray(rng.normal(size=(B, t, N, H)), dtype) for t in (q_len, k_len, k_len))
    pos = {
        "q_pos": jnp.arange(q_len, dtype=jnp.int32),
        "k_pos": jnp.arange(k_len, dtype=jnp.int32) - (k_len - q_len),
        "key_valid": jnp.arange(k_len) >= invalid,
    }
    return (q, k, v), pos


def _attention(scheme, tiled, pos, key_tile, **kw):
    """``attend`` with the scheme's callbacks: the tile form if ``tiled``, else the per-pair one.
    ``key_tile`` is a number of keys, or (keys, queries) per tile."""
    if isinstance(key_tile, tuple):
        key_tile, kw["query_tile"] = key_tile
    _, tile_term, pair_term, value_term = scheme
    logit_term = tile_term if tiled else pair_term

    def run(q, k, v, prm):
        return attend(
            q, k, v, **pos, scale=SCALE, params=prm, logit_term=logit_term,
            value_term=value_term, key_tile=key_tile, **kw,
        )  # fmt: skip

    return run


# The correctness tests compile dozens of small programs: XLA's backend optimisations off halves
# their compile time (the memory test compiles with the defaults, as the model would).
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_llvm_disable_expensive_passes": True}


def _out_and_grads(run, compiler_options=FAST_COMPILE):
    """One jitted function: the output and the gradients of ``Σ out·w`` for (q, k, v, params)."""

    def both(q, k, v, prm, w):
        out, vjp = jax.vjp(run, q, k, v, prm)
        return out, vjp(w.astype(out.dtype))

    return jax.jit(both, compiler_options=compiler_options)


def _compare(rng, scheme, qkv, pos, key_tiles, *, atol_out=1e-5, atol_grad=1e-4, **kw):
    """Tiled (each of ``key_tiles``: keys, or (keys, queries), per tile; inputs as given) against
    dense (float32, per-pair term)."""
    params = scheme[0]
    qkv32 = [x.astype(jnp.float32) for x in qkv]
    w = jnp.asarray(rng.normal(size=qkv[0].shape), jnp.float32)
    dense, g_dense = _out_and_grads(_attention(scheme, False, pos, None, **kw))(*qkv32, params, w)
    names = ["q", "k", "v"] + [f"params/{name}" for name in params or {}]
    for leaf, name in zip(jax.tree.leaves(g_dense), names, strict=True):
        assert np.abs(np.asarray(leaf)).max() > 0, f"{name}: no gradient reaches it"
    for key_tile in key_tiles:
        run = _out_and_grads(_attention(scheme, True, pos, key_tile, **kw))
        tiled, g_tiled = run(*qkv, params, w)
        assert tiled.dtype == qkv[0].dtype and tiled.shape == qkv[0].shape
        tiled = np.asarray(tiled, np.float32)
        assert np.isfinite(tiled).all()
        np.testing.assert_allclose(tiled, dense, atol=atol_out, rtol=atol_out)
        pairs = zip(names, jax.tree.leaves(g_tiled), jax.tree.leaves(g_dense), strict=True)
        for name, a, b in pairs:
            assert a.shape == b.shape, name
            np.testing.assert_allclose(
                np.asarray(a, np.float32), b, atol=atol_grad, rtol=atol_grad,
                err_msg=f"{name}, key_tile={key_tile}",
            )  # fmt: skip


# --------------------------------------------------------------------------------- the tests


@pytest.mark.parametrize("scheme", sorted(SCHEMES))
def test_tiled_matches_dense_over_memory(scheme, rng):
    """T = 6 queries against K = 10 keys (4 of memory, the first 3 never written, so tile 0 of
    size 3 is wholly invalid), same_length's max_distance, tiles of 3 and 4 keys (not dividing K),
    and of 4 keys by 4 queries (not dividing T; tiles past every query's reach are skipped)."""
    qkv, pos = _window(rng, 6, 10, invalid=3)
    _compare(rng, SCHEMES[scheme](rng), qkv, pos, (3, 4, (4, 4)), max_distance=5)


@pytest.mark.slow
def test_tiled_matches_dense_without_memory(rng):
    """T = K = 7, every key valid, no max_distance; tiles of one key, of 5 and larger than K, and
    of 2 keys by 3 queries (the causal upper tiles skipped)."""
    qkv, pos = _window(rng, 7, 7)
    _compare(rng, SCHEMES["shaw"](rng), qkv, pos, (1, 5, 12, (2, 3)))


def test_plain_attention_without_params(rng):
    """No callbacks and ``params=None``: content attention alone, tiles of 4 over 9 keys."""
    qkv, pos = _window(rng, 5, 9, invalid=1)
    _compare(rng, (None, None, None, None), qkv, pos, (4,), max_distance=6)


@pytest.mark.parametrize("scheme", ["shaw", pytest.param("txl", marks=pytest.mark.slow)])
def test_tiled_matches_dense_with_a_mask(scheme, rng):
    """A given ``[T, K]`` mask replaces the causal rule (key validity still applies): here a
    random one, with the diagonal (each query's own position) always allowed."""
    qkv, pos = _window(rng, 5, 11, invalid=2)
    mask = rng.random((5, 11)) < 0.5
    mask[np.arange(5), np.arange(5) + 6] = True
    _compare(rng, SCHEMES[scheme](rng), qkv, pos, (4,), mask=jnp.asarray(mask))


@pytest.mark.parametrize("scheme", [pytest.param("shaw", marks=pytest.mark.slow), "txl"])
def test_tiled_bf16_matches_dense_float32(scheme, rng):
    """bf16 q, k, v (output and gradients in bf16) against the float32 dense reference."""
    qkv, pos = _window(rng, 8, 13, invalid=1, dtype=jnp.bfloat16)
    kw = {"atol_out": 3e-2, "atol_grad": 6e-2, "max_distance": 9}
    _compare(rng, SCHEMES[scheme](rng), qkv, pos, (4,), **kw)


def test_txl_band_matches_per_pair(rng):
    """The band-and-shift callback equals the per-pair definition on one dense tile and on
    every (ragged, padded) tile, where padding keys continue the window's positions."""
    params, band, per_pair, _ = _txl_scheme(rng)
    band, per_pair = (jax.jit(f, compiler_options=FAST_COMPILE) for f in (band, per_pair))
    (q, k, _), pos = _window(rng, 6, 10)
    want = per_pair(params, q, k, pos["q_pos"], pos["k_pos"])
    np.testing.assert_allclose(band(params, q, k, pos["q_pos"], pos["k_pos"]), want, atol=1e-5)
    for start in (0, 3, 6, 9):
        k_pos = pos["k_pos"][0] + start + jnp.arange(3)
        for rows in (slice(0, 6), slice(0, 4), slice(4, 6)):  # every query, or a query tile
            args = (params, q[:, rows], k[:, :3], pos["q_pos"][rows], k_pos)
            np.testing.assert_allclose(band(*args), per_pair(*args), atol=1e-5)


def test_dense_matches_a_naive_softmax(rng):
    """The reference itself: per-row numpy softmax over the allowed keys (valid, causal, within
    max_distance), plus the bias; the output of the bias scheme."""
    params, term, _, _ = _bias_scheme(rng)
    (q, k, v), pos = _window(rng, 6, 10, invalid=2)
    run = _attention((params, term, term, None), False, pos, None, max_distance=4)
    out = jax.jit(run, compiler_options=FAST_COMPILE)(q, k, v, params)
    bias = np.asarray(term(params, q, k, pos["q_pos"], pos["k_pos"]))[0]
    qn, kn, vn = (np.asarray(x, np.float64) for x in (q, k, v))
    want = np.zeros(qn.shape)
    for b in range(B):
        for n in range(N):
            for i in range(6):
                rel = int(pos["q_pos"][i]) - np.asarray(pos["k_pos"])
                ok = (rel >= 0) & (rel <= 4) & np.asarray(pos["key_valid"])
                s = SCALE * kn[b, :, n] @ qn[b, i, n] + bias[n, i]
                p = np.where(ok, np.exp(s - s[ok].max()), 0.0)
                want[b, i, n] = p @ vn[b, :, n] / p.sum()
    np.testing.assert_allclose(out, want, atol=1e-5)


_SHAPE = re.compile(r"\b(?:f32|bf16|f16|s32|u32|pred|u8|s8)\[([\d,]*)\]")


def _largest_array(hlo: str) -> int:
    """The most elements of any array shape written in an HLO module's text."""
    sizes = [int(np.prod([int(d) for d in dims.split(",") if d])) for dims in _SHAPE.findall(hlo)]
    return max(sizes)


@pytest.mark.slow
def test_backward_holds_no_T_by_K_buffer(rng):
    """Memory: T = 64 queries, K = 512 keys, tiles of 64, Shaw's two sides (the value side's
    scatter included), output and gradients in one ``jit``.

    1. The compiled module (after XLA's optimisations) names no array shape with B·N·T·K = 131,072
       elements or more: its largest is one tile's B·N·T·J = 16,384; with query tiles of 16 rows,
       one tile's B·N·I·J or the keys' B·K·N·H. Any [B, N, T, K] logits,
       weights, mask or gradient would show as such a shape, whatever XLA fuses or reorders; the
       same check on the dense path does find one, so the check can fail.
    2. XLA's temp allocation (``memory_analysis``) grows with K only by O(K·N·H) (keys, values and
       their gradients), not by T·K: doubling K to 1,024 adds less than a tenth of one float32
       [B, N, T, 512] block, and the tiled temp is several times below the dense path's."""
    t_len, tile = 64, 64
    scheme = _shaw_scheme(rng)
    compiled = {}
    for name, k_len, key_tile in (
        ("tiled", 512, tile), ("dense", 512, None), ("long", 1024, tile),
        ("query tiles", 512, (tile, 16)),
    ):  # fmt: skip
        (q, k, v), pos = _window(rng, t_len, k_len, invalid=3)
        run = _out_and_grads(_attention(scheme, True, pos, key_tile, max_distance=300), None)
        compiled[name] = run.lower(q, k, v, scheme[0], q).compile()
    big = B * N * t_len * 512
    largest = {name: _largest_array(c.as_text()) for name, c in compiled.items()}
    assert max(largest["tiled"], largest["long"]) <= B * N * t_len * tile, largest
    assert largest["query tiles"] <= max(B * N * 16 * tile, B * 512 * N * H), largest
    assert largest["dense"] >= big, largest
    temp = {name: c.memory_analysis().temp_size_in_bytes for name, c in compiled.items()}
    assert temp["long"] - temp["tiled"] < 4 * big // 10, temp
    assert 4 * temp["tiled"] < temp["dense"], temp


# ------------------------------------------------------------------------------------ dropout


def _reference_keep(key, rate, q_len, k_len, key_tile, query_tile):
    """The documented masks: tile (i, t) keeps ``keep_mask(fold_in(key, i·n_t + t), (B, N, I, J),
    rate)``, tiles side by side over the padded window, cut to [T, K]; as float factors (0 or
    1/(1 − rate))."""
    tiles, row_tiles = -(-k_len // key_tile), -(-q_len // query_tile)
    rows = []
    for i in range(row_tiles):
        parts = []
        for t in range(tiles):
            shape = (B, N, query_tile, key_tile)
            keep, factor = keep_mask(jax.random.fold_in(key, i * tiles + t), shape, rate)
            parts.append(jnp.where(keep, factor, 0.0))
        rows.append(jnp.concatenate(parts, axis=-1))
    return jnp.concatenate(rows, axis=-2)[..., :q_len, :k_len]


def _reference_with_dropout(scheme, pos, keep, max_distance):
    """Straightforward attention (no custom VJP, no tiles) with given dropout factors."""
    _, _, pair_term, value_term = scheme

    def run(q, k, v, prm):
        s = SCALE * jnp.einsum("binh,bjnh->bnij", q, k)
        s = s + pair_term(prm, q, k, pos["q_pos"], pos["k_pos"])
        rel = pos["q_pos"][:, None] - pos["k_pos"][None, :]
        ok = (rel >= 0) & (rel <= max_distance) & pos["key_valid"][None, :]
        p = jax.nn.softmax(jnp.where(ok, s, -1e30), axis=-1) * keep
        out = jnp.einsum("bnij,bjnh->binh", p, v)
        return out + value_term(prm, p, pos["q_pos"], pos["k_pos"])

    return run


@pytest.mark.parametrize("key_tile", [(4, 4), pytest.param(10, marks=pytest.mark.slow)])
def test_dropout_matches_reference_with_the_same_masks(key_tile, rng):
    """Tiled attention with dropout equals, in value and in gradients (its custom VJP redraws the
    masks), plain autodiff of a straightforward implementation given the documented per-tile
    masks; with key_tile = K (one query tile) it also equals the dense path's dropout."""
    scheme = _shaw_scheme(rng)
    params = scheme[0]
    (q, k, v), pos = _window(rng, 6, 10, invalid=2)
    key, rate = jax.random.key(7), 0.3
    keys, queries = key_tile if isinstance(key_tile, tuple) else (key_tile, 6)
    keep = _reference_keep(key, rate, 6, 10, keys, queries)
    assert 0 < float((keep == 0).mean()) < 0.6
    w = jnp.asarray(rng.normal(size=q.shape), jnp.float32)
    want, g_want = _out_and_grads(_reference_with_dropout(scheme, pos, keep, 5))(q, k, v, params, w)
    kw = {"dropatt": rate, "dropout_key": key, "max_distance": 5}
    got, g_got = _out_and_grads(_attention(scheme, True, pos, key_tile, **kw))(q, k, v, params, w)
    np.testing.assert_allclose(got, want, atol=1e-5)
    for a, b in zip(jax.tree.leaves(g_got), jax.tree.leaves(g_want), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)
    if key_tile == 10:
        dense = jax.jit(_attention(scheme, True, pos, None, **kw), compiler_options=FAST_COMPILE)
        np.testing.assert_allclose(dense(q, k, v, params), got, atol=1e-5)


def test_dropout_is_deterministic_given_the_key(rng):
    """Same key, same output; another key, another; rate 0 (with a key) is no dropout."""
    scheme = _shaw_scheme(rng)
    (q, k, v), pos = _window(rng, 6, 10, invalid=2)

    def run(q, k, v, prm, key, rate):
        kw = {"dropatt": rate, "dropout_key": key} if key is not None else {}
        return _attention(scheme, True, pos, 4, **kw)(q, k, v, prm)

    run = jax.jit(run, static_argnums=5, compiler_options=FAST_COMPILE)
    out = {
        name: np.asarray(run(q, k, v, scheme[0], key, rate))
        for name, key, rate in (
            ("a", jax.random.key(1), 0.4),
            ("again", jax.random.key(1), 0.4),
            ("b", jax.random.key(2), 0.4),
            ("rate 0", jax.random.key(1), 0.0),
            ("no key", None, 0.0),
        )
    }
    np.testing.assert_array_equal(out["a"], out["again"])
    assert np.abs(out["a"] - out["b"]).max() > 1e-3
    np.testing.assert_array_equal(out["rate 0"], out["no key"])
    assert np.abs(out["a"] - out["no key"]).max() > 1e-3


def test_arguments_are_checked(rng):
    (q, k, v), pos = _window(rng, 4, 6)
    with pytest.raises(ValueError, match="dropout_key"):
        attend(q, k, v, **pos, scale=1.0, dropatt=0.1)
    with pytest.raises(ValueError, match="dropatt"):
        attend(q, k, v, **pos, scale=1.0, dropatt=1.0, dropout_key=jax.random.key(0))
    with pytest.raises(ValueError, match="mask"):
        attend(q, k, v, **pos, scale=1.0, mask=jnp.ones((4, 5), bool))
    with pytest.raises(ValueError, match="key_tile"):
        attend(q, k, v, **pos, scale=1.0, key_tile=0)
