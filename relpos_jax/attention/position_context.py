"""What every layer needs about positions: the queries' and keys' positions, the mask, which memory
slots hold states, and the scheme's own context, built once per forward pass by the model.

Legend: T queries, K keys (memory + segment).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax

from relpos_jax.attention import tile
from relpos_jax.schemes import Tile


class PositionContext(NamedTuple):
    """What every layer needs about positions, built once per forward pass by the model.

    Query t may attend key k when ``key_valid[k]`` and ``0 ≤ q_pos[t] − k_pos[k]`` (with
    same_length, at most M = K − T), or, when ``mask [T, K]`` is given, when ``mask[t, k]``.
    Nothing of size T·K is kept here: the dense path builds the ``[T, K]`` mask (``allowed``), the
    tiled path a tile's."""

    q_pos: jax.Array  # [T] int
    k_pos: jax.Array  # [K] int
    mask: jax.Array | None = None  # [T, K] bool: replaces the causal rule (tests, probes)
    key_valid: jax.Array | None = None  # [K] bool: memory slots that hold states
    scheme: Any = None  # the scheme's own context (Scheme.context), a pytree

    def tile(self) -> Tile:
        """The whole window as one tile: the queries are its last T positions."""
        return Tile(self.q_pos, self.k_pos, self.k_pos.shape[0] - self.q_pos.shape[0], 0)

    def allowed(self, max_distance: int | None) -> jax.Array:
        """``[T, K]`` bool: which keys each query may attend (the dense path's mask); keys more than
        ``max_distance`` back are out (same_length)."""
        return tile.allowed(
            self.q_pos, self.k_pos, self.key_valid, max_distance=max_distance, mask_IJ=self.mask
        )
