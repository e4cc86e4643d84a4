"""The absolute sinusoid of Vaswani et al. 2017, added to the token embeddings (with memory, at the
queries' positions in the stream)."""

from __future__ import annotations

from typing import Any

from relpos_jax import positions as P
from relpos_jax.errors import fail
from relpos_jax.schemes.base import Scheme, register


@register
class Sinusoid(Scheme):
    name = "sinusoid"
    relative = False

    def validate(self, cfg: Any) -> None:
        if cfg.d_model % 2:
            fail("model.d_model", cfg.d_model, "the sinusoid needs an even d_model")

    def embed(self, model, x_BTD, q_pos):
        return x_BTD + P.sinusoid(q_pos, model.config.d_model).astype(x_BTD.dtype)
