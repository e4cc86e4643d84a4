"""The Pallas kernels (``attention.kernel``), both variants in Pallas' interpreter, against a
float64 reference built from the formulas: the output and the gradients of q, k, v, the band query,
every table by distance and FIRE's parameters, with memory, invalid keys, same_length and dropout, over several
blocks (segment 40, memory 24, blocks of 16: 3 query blocks and 4 key blocks). On a GPU or TPU
the compiled kernel of its backend runs the same tests (``bench/gpu.sh`` runs this file first)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from relpos_jax.attention import kernel
from relpos_jax.attention.kernel import skew
from relpos_jax.schemes import fire

pytestmark = pytest.mark.usefixtures("float32_products")  # conftest.py: IEEE float32 on a GPU

B, T, M, N, H = 2, 40, 24, 2, 16
# (backend, interpreted): both variants in the interpreter; compiled too on a GPU or TPU
DEVICE = kernel.backend_of()
VARIANTS = [("triton", True), ("mosaic", True)] + ([(DEVICE, False)] if DEVICE else [])
NAMES = [
    f"{backend}-{'interpreted' if interpret else 'compiled'}" for backend, interpret in VARIANTS
]
K, SCALE = M + T, 0.25
DIFFERENTIABLE = ("a", "logit_rows", "bias_rows", "value_rows")


def _fire_bias(c, threshold, first_query, w1, b1, w2_HN, b2_N):
    """FIRE's ``[N, T, K]``: ``f(ψ(d)/ψ(max(L, i)))``, ``ψ(x) = log(1 + c·x)``, the query
    positions counting from ``first_query``."""
    d = np.maximum(M + np.arange(T)[:, None] - np.arange(K)[None, :], 0)
    position = first_query + jnp.arange(T)[:, None]
    x = jnp.log1p(c * d) / jnp.log1p(c * jnp.maximum(threshold, position))
    hidden = jax.nn.relu(x[..., None] * w1 + b1)
    return jnp.moveaxis(hidden @ w2_HN + b2_N, -1, 0)


def _reference(q, k, v, valid, a=None, logit_rows=None, bias_rows=None, value_rows=None,
               fire=None, max_distance=None, dropatt=0.0, seed=0):  # fmt: skip
    """The formulas on the whole ``[T, K]``: ``scale·q·k + a_i·w_d + b_d`` (+ FIRE's bias),
    masked, softmax, dropout (the kernels' hash), ``Σ p (v + w^V_d)``."""
    d = M + np.arange(T)[:, None] - np.arange(K)[None, :]
    rows = lambda table: table[:, np.clip(d, 0, table.shape[1] - 1)]  # noqa: E731
    s = SCALE * jnp.einsum("bind,bjnd->bnij", q, k)
    if a is not None:
        w = jnp.broadcast_to(rows(logit_rows), (N, T, K, H))
        s = s + jnp.einsum("bind,nijd->bnij", a, w)
    if bias_rows is not None:
        s = s + rows(bias_rows)[None]
    if fire is not None:
        s = s + _fire_bias(**fire)[None]
    ok = (d >= 0) & valid[None, :]
    if max_distance is not None:
        ok &= d <= max_distance
    p = jax.nn.softmax(jnp.where(ok, s, -1e30), axis=-1) * ok
    if dropatt:
        row = (np.arange(B)[:, None] * N + np.arange(N)[None]).reshape(B, N, 1, 1)
        keep = skew.keep(seed, row, np.arange(T)[:, None], np.arange(K)[None], dropatt)
        p = jnp.where(np.asarray(keep), p / (1 - dropatt), 0.0)
    out = jnp.einsum("bnij,bjnd->bind", p, v)
    if value_rows is not None:
        w = jnp.broadcast_to(rows(value_rows), (N, T, K, H))
        out = out + jnp.einsum("bnij,nijd->bind", p, w)
    return out


CASES = {
    "content only": {},
    "band (txl)": {"band"},
    "bias (t5, alibi)": {"bias"},
    "values (shaw)": {"values"},
    "every term, same_length": {"band", "bias", "values", "reach"},
    "dropout": {"bias", "values", "dropout"},
    "fire": {"fire"},
}


def _inputs(terms):
    rng = np.random.default_rng(0)
    normal = lambda *shape: rng.normal(size=shape)  # noqa: E731
    valid = np.ones(K, bool)
    valid[:5] = False  # the oldest memory slots hold no states
    arrays = {"q": normal(B, T, N, H), "k": normal(B, K, N, H), "v": normal(B, K, N, H)}
    options = {}
    if "band" in terms:
        arrays |= {"a": 0.3 * normal(B, T, N, H), "logit_rows": 0.5 * normal(N, K, H)}
    if "bias" in terms:
        arrays["bias_rows"] = normal(N, K)
    if "values" in terms:
        arrays["value_rows"] = 0.5 * normal(1, K, H)  # shared by the heads
    if "fire" in terms:  # L between query positions (5 … 44): both decide the normaliser
        arrays["fire"] = {
            "c": np.asarray(0.3),
            "threshold": np.asarray(30.5),
            "first_query": np.asarray(5.0),
            "w1": normal(8),
            "b1": 0.1 * normal(8),
            "w2_HN": normal(8, N),
            "b2_N": normal(N),
        }
    if "reach" in terms:
        options["max_distance"] = M
    if "dropout" in terms:
        options |= {"dropatt": 0.3, "seed": 7}
    return arrays, valid, options


def _attend(arrays, **options):
    """``kernel.attend`` of arrays by name: q, k, v, the terms (FIRE's parameters as its tile term
    and rows) and the rest."""
    arrays = dict(arrays)
    q, k, v = arrays.pop("q"), arrays.pop("k"), arrays.pop("v")
    terms = {
        n: arrays.pop(n) for n in ("a", "logit_rows", "bias_rows", "value_rows") if n in arrays
    }
    if "fire" in arrays:
        fire_ = arrays.pop("fire")
        terms |= {"tile_rows": fire.pack(**fire_), "tile": fire.FireTile(fire_["w1"].shape[0])}
    return kernel.attend(q, k, v, kernel.Terms(**terms), **arrays, **options)


def _loss(out):
    return (out * jnp.cos(jnp.arange(H))).sum()


@pytest.mark.parametrize(("backend", "interpret"), VARIANTS, ids=NAMES)
@pytest.mark.parametrize("case", CASES)
def test_kernel_equals_the_float64_reference(case, backend, interpret, x64):
    arrays, valid, options = _inputs(CASES[case])

    def run_kernel(arrays):
        f32 = jax.tree.map(lambda x: x.astype(jnp.float32), arrays)
        return _attend(f32, key_valid=valid, scale=SCALE, block=16, backend=backend,
                       interpret=interpret, **options)  # fmt: skip

    def run_reference(arrays):
        return _reference(**arrays, valid=valid, **options)

    arrays = jax.tree.map(lambda x: jnp.asarray(x, jnp.float64), arrays)
    np.testing.assert_allclose(run_kernel(arrays), run_reference(arrays), atol=2e-6)
    got = jax.grad(lambda x: _loss(run_kernel(x)))(arrays)
    want = jax.grad(lambda x: _loss(run_reference(x)))(arrays)
    for path, value in jax.tree.leaves_with_path(want):
        name = jax.tree_util.keystr(path)
        if "first_query" in name:  # a position: the kernels give it no gradient
            continue
        got_value = dict(jax.tree.leaves_with_path(got))[path]
        scale = max(1.0, float(jnp.abs(value).max()))  # FIRE's c and L: sums over every pair
        np.testing.assert_allclose(got_value / scale, value / scale, atol=1e-5, err_msg=name)


@pytest.mark.parametrize(("backend", "interpret"), VARIANTS, ids=NAMES)
def test_bfloat16_inputs_accumulate_in_float32(backend, interpret):
    arrays, valid, _ = _inputs({"band", "bias", "values"})
    bf16 = {name: jnp.asarray(x, jnp.bfloat16) for name, x in arrays.items()}
    out = _attend(bf16, key_valid=valid, scale=SCALE, block=16, backend=backend,
                  interpret=interpret)  # fmt: skip
    assert out.dtype == jnp.bfloat16
    rounded = {name: jnp.asarray(x, jnp.float32) for name, x in bf16.items()}
    want = _reference(**rounded, valid=valid)
    np.testing.assert_allclose(np.asarray(out, np.float32), want, atol=0.05)


def test_dropout_keeps_one_minus_the_rate_and_redraws_with_the_seed():
    rows = np.arange(4).reshape(4, 1, 1)
    queries, keys = np.arange(256)[:, None], np.arange(256)[None]
    kept = np.asarray(skew.keep(3, rows, queries, keys, 0.3))
    assert abs(kept.mean() - 0.7) < 0.01
    other = np.asarray(skew.keep(4, rows, queries, keys, 0.3))
    assert 0.3 < (kept != other).mean() < 0.5  # independent draws differ in 2·0.3·0.7 of places


def test_bad_arguments_are_refused_in_one_line():
    arrays, valid, _ = _inputs({"band"})
    bad = [
        (dict(block=24), "powers of two"),
        (dict(dropatt=0.1), "with a seed"),
        (dict(a=None), "a and logit_rows come together"),
        (dict(backend="cuda"), "no Pallas backend"),
        (dict(backend="mosaic", interpret=False), "multiple of 128"),
    ]
    for change, message in bad:
        call = dict(arrays, key_valid=valid, scale=SCALE, block=16, backend="triton",
                    interpret=True) | change  # fmt: skip
        with pytest.raises(ValueError, match=message):
            _attend(call)
