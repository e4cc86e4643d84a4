"""T5 relative buckets (Raffel et al. 2020): a learned scalar per (bucket of the distance, head),
one table shared by every layer, added to the logits after scaling."""

from __future__ import annotations

from typing import Any, ClassVar

import ml_collections

from relpos_jax import positions as P
from relpos_jax.errors import at_least, fail
from relpos_jax.schemes.base import Scheme, Tile, normal_param, register


@register
class T5(Scheme):
    name = "t5"
    must_match = ("num_buckets",)
    renamed: ClassVar[dict[str, str]] = {
        "t5_num_buckets": "num_buckets",
        "t5_max_distance": "max_distance",
    }

    def config(self) -> ml_collections.ConfigDict:
        # the buckets (half exact distances, half logarithmic) and the distance of the last one
        return ml_collections.ConfigDict({"num_buckets": 32, "max_distance": 128})

    def check_settings(self, own: Any) -> None:
        at_least("model.t5.num_buckets", own.num_buckets, 1)
        at_least("model.t5.max_distance", own.max_distance, 1)
        if own.max_distance <= own.num_buckets // 2:
            fail(
                "model.t5.max_distance",
                own.max_distance,
                f"it must exceed model.t5.num_buckets // 2 = {own.num_buckets // 2}",
            )

    def shared_params(self, cfg: Any, rngs) -> dict[str, Any]:
        shape = (cfg.t5.num_buckets, cfg.n_heads)
        return {"t5_table": normal_param(rngs, shape, cfg.init_std, ("rows", "heads"))}

    def context(self, model, q_pos, k_pos, deterministic) -> dict[str, Any]:
        return {"table": model.position.t5_table[...]}

    def bias(self, own, tile: Tile, context):
        return P.t5_bias(
            tile.q_pos,
            tile.k_pos,
            context["table"],
            bidirectional=False,
            max_distance=own.config.t5.max_distance,
        )
