"""Fused relative attention in Pallas: the tile contract as one GPU (Triton) or TPU (Mosaic)
kernel, forward and backward (``attend``), of the terms a scheme gives (``Terms``; a term evaluated
in each tile is a ``TileTerm``). The kernels name no scheme."""

from relpos_jax.attention.kernel.api import Terms, attend, backend_of, supports, unavailable
from relpos_jax.attention.kernel.common import TileTerm

__all__ = ["Terms", "TileTerm", "attend", "backend_of", "supports", "unavailable"]
