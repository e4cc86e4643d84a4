"""Shaw, Uszkoreit & Vaswani 2018: learned vectors of the clipped distance on the key and value sides.

``e_ij = q_iᵀ(k_j + a^K_ij)/√H`` and ``z_i = Σ_j α_ij (v_j + a^V_ij)``, each table ``[2k + 1, H]`` per
layer, shared by the heads; a tile reads the rows of its own distances (``positions.shaw``).
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax.numpy as jnp
import ml_collections

from relpos_jax import positions as P
from relpos_jax.errors import at_least
from relpos_jax.schemes.base import Scheme, Tile, normal_param, register


@register
class Shaw(Scheme):
    name = "shaw"
    must_match = ("max_distance",)
    renamed: ClassVar[dict[str, str]] = {"shaw_max_distance": "max_distance"}

    def config(self) -> ml_collections.ConfigDict:
        return ml_collections.ConfigDict({"max_distance": 64})  # k: the tables have 2k + 1 rows

    def check_settings(self, own: Any) -> None:
        at_least("model.shaw.max_distance", own.max_distance, 1)

    def layer_params(self, cfg: Any, rngs) -> dict[str, Any]:
        rows, h = 2 * cfg.shaw.max_distance + 1, cfg.head_dim
        return {
            "table_k": normal_param(rngs, (rows, h), cfg.init_std, ("rows", "head_dim")),
            "table_v": normal_param(rngs, (rows, h), cfg.init_std, ("rows", "head_dim")),
        }

    def score_term(self, own, q_BINH, k, tile: Tile, context):
        table = own.table_k[...].astype(q_BINH.dtype)
        return P.shaw_key_logits(q_BINH, table, tile.q_pos, tile.k_pos)

    def distance_tables(self, attention, context, count: int):
        """Both tables' rows for distances ``0 … count − 1`` (clipped at k), shared by the heads."""
        own = attention.position
        index = P.shaw_index(jnp.arange(count), own.config.shaw.max_distance)
        return {
            "key_rows": own.table_k[...][index][None],
            "value_rows": own.table_v[...][index][None],
        }

    def value_term(self, own, weights_BNIJ, tile: Tile, context):
        table = own.table_v[...].astype(weights_BNIJ.dtype)
        return P.shaw_value_output(weights_BNIJ, table, tile.q_pos, tile.k_pos)
