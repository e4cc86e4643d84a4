"""Attention over memory + segment: ``dense`` (one tile covering every key, the reference) and, on
the same tile contract, ``tiled`` (key tiles with an online softmax: nothing of size T·K is live)."""

from relpos_jax.attention.dense import Attention, PositionContext, normal_param

__all__ = ["Attention", "PositionContext", "normal_param"]
