"""Attention over memory + segment: the layer (``layer.Attention``: projections and the scheme's
hooks) apart from the op (``op.attend``: dense, tiled, kernel, or ring over the context axis), on
one tile contract (``schemes.Tile``)."""

from relpos_jax.attention.layer import Attention
from relpos_jax.attention.position_context import PositionContext
from relpos_jax.schemes import normal_param

__all__ = ["Attention", "PositionContext", "normal_param"]
