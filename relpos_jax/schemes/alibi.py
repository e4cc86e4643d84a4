"""ALiBi (Press et al. 2022): ``−slope_h·|q − k|`` added after scaling; fixed geometric slopes."""

from __future__ import annotations

from relpos_jax import positions as P
from relpos_jax.schemes.base import Scheme, Tile, register


@register
class ALiBi(Scheme):
    name = "alibi"

    def bias(self, own, tile: Tile, context):
        slopes = P.alibi_slopes(own.config.n_heads)
        return P.alibi_bias(tile.q_pos, tile.k_pos, slopes)
