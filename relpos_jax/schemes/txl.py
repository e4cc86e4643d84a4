"""Transformer-XL (Dai et al. 2019, §3.3): ``A_ij = (q_i + u)ᵀk_j + (q_i + v)ᵀ W_R R_{i−j}``.

R is the sinusoid of the distance (capped at ``clamp_len``), W_R a per-layer projection, u and v
global biases (one pair per layer with ``model.txl.untie_r``). Each layer projects every distance once
(``W_R·R``, ``[K, N, H]``); a tile's distances form a band: the tile needs only those rows, scored
against ``q + v`` and slid into place by ``rel_shift`` — for the dense window (one tile) exactly the
paper's fast relative shift.
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import ml_collections

from relpos_jax import positions as P
from relpos_jax.errors import fail
from relpos_jax.ops import precision
from relpos_jax.schemes.base import Scheme, Tile, normal_param, register


@register
class TransformerXL(Scheme):
    name = "txl"
    must_match = ("untie_r",)
    renamed: ClassVar[dict[str, str]] = {"untie_r": "untie_r"}

    def config(self) -> ml_collections.ConfigDict:
        return ml_collections.ConfigDict(
            {"untie_r": False}
        )  # one u/v pair per layer (False: shared)

    def validate(self, cfg: Any) -> None:
        if cfg.d_model % 2:
            fail("model.d_model", cfg.d_model, "the sinusoid needs an even d_model")

    def shared_params(self, cfg: Any, rngs) -> dict[str, Any]:
        if cfg.txl.untie_r:
            return {}
        n, h = cfg.n_heads, cfg.head_dim
        return {
            "u": normal_param(rngs, (n, h), cfg.init_std, ("heads", "head_dim")),
            "v": normal_param(rngs, (n, h), cfg.init_std, ("heads", "head_dim")),
        }

    def layer_params(self, cfg: Any, rngs) -> dict[str, Any]:
        d, n, h = cfg.d_model, cfg.n_heads, cfg.head_dim
        params = {
            "w_r": normal_param(rngs, (d, n, h), cfg.init_std, ("embed", "heads", "head_dim"))
        }
        if cfg.txl.untie_r:
            params["u"] = normal_param(rngs, (n, h), cfg.init_std, ("heads", "head_dim"))
            params["v"] = normal_param(rngs, (n, h), cfg.init_std, ("heads", "head_dim"))
        return params

    def context(self, model, q_pos, k_pos, deterministic) -> dict[str, Any]:
        """``r_KD``: the sinusoid of distances ``K − 1 … 0`` (after dropout, as the official code),
        and the shared u, v."""
        cfg = model.config
        r = P.relative_sinusoid(k_pos.shape[0], cfg.d_model, cfg.clamp_len)
        context = {"r_KD": model.drop(r, deterministic=deterministic)}
        if not cfg.txl.untie_r:
            context["u"], context["v"] = model.position.u[...], model.position.v[...]
        return context

    def layer_context(self, attention, context, dtype) -> dict[str, Any]:
        """``r_KNH = R·W_R``, the layer's projection of every distance's sinusoid, once per layer
        (a tile reads its band of rows)."""
        r_KD, w_r = context["r_KD"].astype(dtype), attention.position.w_r[...].astype(dtype)
        shared = {name: bias for name, bias in context.items() if name != "r_KD"}  # u, v
        return {**shared, "r_KNH": precision.einsum("kd,dnh->knh", r_KD, w_r)}

    def _biases(self, own, context) -> tuple[jax.Array, jax.Array]:
        if "u" in context:
            return context["u"], context["v"]
        return own.u[...], own.v[...]

    def content_query(self, own, q_BINH, context) -> jax.Array:
        return precision.add_bias(q_BINH, self._biases(own, context)[0])

    def score_term(self, own, q_BINH, k, tile: Tile, context) -> jax.Array:
        """``(q_i + v)ᵀ W_R R_{i−j}`` of the dense window: the band of R rows its causal distances
        need (all of ``r_K`` for the whole window), scored against ``q + v`` and shifted."""
        r_LNH = self._band(context["r_KNH"], tile)
        band = P.rel_shift(
            precision.logits("binh,lnh->bnil", self.band_query(own, q_BINH, context), r_LNH)
        )
        return band[..., : tile.shape[1]]

    def band_query(self, own, q_BINH, context) -> jax.Array:
        return precision.add_bias(q_BINH, self._biases(own, context)[1])

    def band_rows(self, own, context, top, count: int) -> jax.Array:
        """Rows of ``W_R·R`` for distances ``top`` down; beyond the window (padding queries, keys
        ahead of every query) they repeat its edge."""
        r_K = context["r_KNH"]
        padded = jnp.pad(r_K, ((count, count),) + ((0, 0),) * (r_K.ndim - 1), mode="edge")
        return jax.lax.dynamic_slice_in_dim(padded, r_K.shape[0] - 1 - top + count, count, axis=0)

    @staticmethod
    def _band(r_K: jax.Array, tile: Tile) -> jax.Array:
        """Rows of ``r_K`` (distances ``K − 1 … 0``) from the tile's largest distance ``d_max``
        down to its smallest causal one, at least ``max(I, J)`` rows (as many as ``rel_shift``
        reads; rows below distance 0 would only feed masked entries): for the whole window, all
        of ``r_K``."""
        q_len, k_len = tile.shape
        d_max = tile.longest_distance
        d_low = max(d_max - (q_len + k_len - 2), 0)
        length = max(d_max - d_low + 1, q_len, k_len)
        first = r_K.shape[0] - 1 - d_max  # the row of distance d_max (0 ≤ d_max ≤ K − 1)
        return r_K[first : first + length]
