"""No position information at all (NoPE): causal masking alone orders the tokens."""

from __future__ import annotations

from relpos_jax.schemes.base import Scheme, register


@register
class NoPositions(Scheme):
    name = "none"
