"""Fused relative attention in Pallas: the tile contract as one GPU (Triton) or TPU (Mosaic)
kernel, forward and backward (``attend``)."""

from relpos_jax.attention.kernel.api import attend, backend_of, supports, unavailable

__all__ = ["attend", "backend_of", "supports", "unavailable"]
