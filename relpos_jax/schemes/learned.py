"""Learned absolute positions (GPT-2 style): a ``[max_len, D]`` table added to the token embeddings
(``model.learned.max_len`` rows); positions past it reuse the last row."""

from __future__ import annotations

from typing import Any, ClassVar

import ml_collections

from relpos_jax import positions as P
from relpos_jax.errors import at_least
from relpos_jax.schemes.base import Scheme, normal_param, register


@register
class Learned(Scheme):
    name = "learned"
    relative = False
    must_match = ("max_len",)
    renamed: ClassVar[dict[str, str]] = {"max_len": "max_len"}

    def config(self) -> ml_collections.ConfigDict:
        return ml_collections.ConfigDict({"max_len": 4096})  # rows of the table

    def check_settings(self, own: Any) -> None:
        at_least("model.learned.max_len", own.max_len, 1)

    def shared_params(self, cfg: Any, rngs) -> dict[str, Any]:
        shape = (cfg.learned.max_len, cfg.d_model)
        return {"position_table": normal_param(rngs, shape, cfg.init_std, ("rows", "embed"))}

    def embed(self, model, x_BTD, q_pos):
        return x_BTD + P.learned_lookup(model.position.position_table[...], q_pos).astype(
            x_BTD.dtype
        )
