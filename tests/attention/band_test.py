"""The band term of the tiled path (``attention.band``: each distance's product once per query tile,
carried from key tile to key tile) against the per-pair definition of Transformer-XL's
``u·k + (q + v)·W_R·R(d)``: output and the gradients of q, k, v, u, v and W_R, over memory-like
windows with invalid keys and same_length, for tiles of as many queries as keys, one more, fewer,
and more than one more (the previous products then computed per tile)."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from relpos_jax.attention import band
from relpos_jax.attention.tiled import attend
from relpos_jax.positions.absolute import sinusoid
from tests.attention.tiled_attention_test import (
    FAST_COMPILE,
    SCALE,
    D,
    _out_and_grads,
    _txl_content,
    _txl_per_pair,
    _txl_scheme,
    _window,
)


def _band(shift: int = 0) -> band.Band:
    """Transformer-XL's position half as a band; ``shift``: rows one distance off (a defect)."""

    def query(prm, q):
        return SCALE * (q.astype(jnp.float32) + prm["v"])

    def rows(prm, top, count):
        distances = top + shift - jnp.arange(count)
        return jnp.einsum("rd,dnh->rnh", sinusoid(distances, D), prm["w_r"])

    return band.Band(query, rows)


def _content(prm, q, k, q_pos, k_pos):
    return SCALE * _txl_content(prm, k)


def _run(pos, key_tile, query_tile, band_term, **kw):
    def run(q, k, v, prm):
        if band_term is None:  # the per-pair reference, one dense tile
            return attend(q, k, v, **pos, scale=SCALE, params=prm, logit_term=_txl_per_pair, **kw)
        return attend(
            q, k, v, **pos, scale=SCALE, params=prm, logit_term=_content, band=band_term,
            key_tile=key_tile, query_tile=query_tile, **kw,
        )  # fmt: skip

    return _out_and_grads(run)


def _errors(rng, tiles, shift=0, **kw):
    """Largest |tiled − reference| of the output and of each gradient, for each (keys, queries)."""
    params = _txl_scheme(rng)[0]
    (q, k, v), pos = _window(rng, 7, 12, invalid=3)
    w = jnp.asarray(rng.normal(size=q.shape), jnp.float32)
    want = _run(pos, None, None, None, **kw)(q, k, v, params, w)
    errors = {}
    for key_tile, query_tile in tiles:
        got = _run(pos, key_tile, query_tile, _band(shift), **kw)(q, k, v, params, w)
        errors[key_tile, query_tile] = [
            float(jnp.abs(a - b).max())
            for a, b in zip(*map(jax.tree.leaves, (got, want)), strict=True)
        ]
    return errors


@pytest.mark.parametrize("max_distance", [None, 6])
def test_band_equals_the_per_pair_term_for_every_tile_shape(rng, max_distance):
    """Keys by queries per tile: 3 by 3, 3 by 4 (I = J + 1), 5 by 2 (I < J), 2 by 5 and 3 by 7
    (I > J + 1: the previous products per tile), 12 by 7 (one tile), and 4 by 4 with a wholly
    invalid first key tile (a skipped tile, then products computed afresh)."""
    tiles = ((3, 3), (3, 4), (5, 2), (2, 5), (3, 7), (12, 7), (4, 4))
    for tile, errors in _errors(rng, tiles, max_distance=max_distance).items():
        assert errors[0] < 1e-5, (tile, errors)
        assert max(errors[1:]) < 1e-4, (tile, errors)


def test_a_band_off_by_one_row_is_caught(rng):
    """The check can fail: rows one distance off change the output well beyond the tolerance."""
    for tile, errors in _errors(rng, ((3, 3), (2, 5)), shift=1).items():
        assert errors[0] > 1e-2, (tile, errors)


def test_the_whole_window_band_equals_the_per_pair_term(rng):
    """``band.whole``: one tile computed on its own (the dense reference's form of the band)."""
    params = _txl_scheme(rng)[0]
    (q, _, _), pos = _window(rng, 7, 12)
    whole = jax.jit(
        lambda q, prm: band.whole(_band(), prm, q, pos["q_pos"][0] - pos["k_pos"][0], 12),
        compiler_options=FAST_COMPILE,
    )
    per_pair = _txl_per_pair(params, q, jnp.zeros((2, 12, 2, 4)), pos["q_pos"], pos["k_pos"])
    np.testing.assert_allclose(whole(q, params), per_pair, atol=1e-5)
