"""Learned absolute positions (GPT-2 style): a ``[max_len, D]`` table added to the token embeddings;
positions past ``max_len`` reuse the last row."""

from __future__ import annotations

from typing import Any

from relpos_jax import positions as P
from relpos_jax.schemes.base import Scheme, normal_param, register


@register
class Learned(Scheme):
    name = "learned"
    relative = False

    def shared_params(self, cfg: Any, rngs) -> dict[str, Any]:
        shape = (cfg.max_len, cfg.d_model)
        return {"position_table": normal_param(rngs, shape, cfg.init_std, ("rows", "embed"))}

    def embed(self, model, x_BTD, q_pos):
        return x_BTD + P.learned_lookup(model.position_table[...], q_pos).astype(x_BTD.dtype)
