"""DeBERTa's disentangled attention (He et al. 2021, v2 buckets, v3 ``share_att_key``):
content-to-position ``q_i·K^r_δ(i,j)`` plus position-to-content ``k_j·Q^r_δ(j,i)``, with the relative
embeddings (shared by the layers, layer-normalised) projected by each layer's own query and key
weights; the scores are scaled by ``1/√(3H)``."""

from __future__ import annotations

import math
from typing import Any, ClassVar

import jax.numpy as jnp
import ml_collections
from flax import nnx

from relpos_jax import positions as P
from relpos_jax.errors import at_least, fail
from relpos_jax.schemes.base import Scheme, Tile, normal_param, register


@register
class DeBERTa(Scheme):
    name = "deberta"
    kv_layout = "bknh"  # keys gathered by row: the window's order
    fused = False  # position-to-content reads the keys by distance: the tiled path runs it

    must_match = ("bucket_size",)
    renamed: ClassVar[dict[str, str]] = {
        "deberta_bucket_size": "bucket_size",
        "deberta_max_position": "max_position",
    }

    def config(self) -> ml_collections.ConfigDict:
        # DeBERTa-v2's log buckets: 2 · bucket_size relative embeddings, exact up to bucket_size / 2
        return ml_collections.ConfigDict({"bucket_size": 256, "max_position": 512})

    def check_settings(self, own: Any) -> None:
        at_least("model.deberta.bucket_size", own.bucket_size, 1)
        at_least("model.deberta.max_position", own.max_position, 1)
        if own.bucket_size % 2 or own.max_position <= own.bucket_size // 2 + 1:
            fail(
                "model.deberta.bucket_size",
                own.bucket_size,
                "use an even size below 2·(model.deberta.max_position − 1)",
            )

    def scale(self, cfg: Any) -> float:
        return 1.0 / math.sqrt(3 * cfg.head_dim)

    def shared_params(self, cfg: Any, rngs) -> dict[str, Any]:
        d = cfg.d_model
        return {
            "rel_embed": normal_param(
                rngs, (2 * cfg.deberta.bucket_size, d), cfg.init_std, ("rows", "embed")
            ),
            "rel_norm": nnx.LayerNorm(d, epsilon=1e-7, rngs=rngs),
        }

    def context(self, model, q_pos, k_pos, deterministic) -> dict[str, Any]:
        return {"rel_RD": model.position.rel_norm(model.position.rel_embed[...])}

    def layer_context(self, attention, context, dtype) -> dict[str, Any]:
        """The relative embeddings projected by the layer's own key and query weights
        (share_att_key), once per layer."""
        rel = context["rel_RD"].astype(dtype)
        return {
            "pos_key": jnp.einsum("rd,dnh->rnh", rel, attention.w_kv[...][:, 0].astype(dtype)),
            "pos_query": jnp.einsum("rd,dnh->rnh", rel, attention.w_q[...].astype(dtype)),
        }

    def score_term(self, own, q_BINH, k_BJNH, tile: Tile, context):
        pos_key, pos_query = context["pos_key"], context["pos_query"]
        settings = own.config.deberta
        index = P.deberta_index(tile.q_pos, tile.k_pos, settings.bucket_size, settings.max_position)
        return P.deberta_c2p(q_BINH, pos_key, index) + P.deberta_p2c(k_BJNH, pos_query, index)
