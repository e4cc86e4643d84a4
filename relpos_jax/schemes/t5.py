"""T5 relative buckets (Raffel et al. 2020): a learned scalar per (bucket of the distance, head),
one table shared by every layer, added to the logits after scaling."""

from __future__ import annotations

from typing import Any

from relpos_jax import positions as P
from relpos_jax.errors import fail
from relpos_jax.schemes.base import Scheme, Tile, normal_param, register


@register
class T5(Scheme):
    name = "t5"

    def validate(self, cfg: Any) -> None:
        if cfg.t5_max_distance <= cfg.t5_num_buckets // 2:
            fail(
                "model.t5_max_distance",
                cfg.t5_max_distance,
                f"it must exceed t5_num_buckets // 2 = {cfg.t5_num_buckets // 2}",
            )

    def shared_params(self, cfg: Any, rngs) -> dict[str, Any]:
        shape = (cfg.t5_num_buckets, cfg.n_heads)
        return {"t5_table": normal_param(rngs, shape, cfg.init_std, ("rows", "heads"))}

    def context(self, model, q_pos, k_pos, deterministic) -> dict[str, Any]:
        return {"table": model.t5_table[...]}

    def bias(self, attention, tile: Tile, context):
        return P.t5_bias(
            tile.q_pos,
            tile.k_pos,
            context["table"],
            bidirectional=False,
            max_distance=attention.config.t5_max_distance,
        )
