"""KERPLE, logarithmic variant (Chi et al., NeurIPS 2022, "Kernelized Relative Positional Embedding
for Length Extrapolation"): a conditionally positive definite kernel of the distance as the bias,

    b(i, j) = −r1 · log(1 + r2 · |i − j|),        r1, r2 > 0 learned per head and layer,

added to the logits after scaling, like ALiBi (which it generalises: a logarithmic instead of a linear
decay). As the authors' code, r1 and r2 start uniform in (0, 2) and (0, 1) and are clamped at 1e-2 to
stay positive.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from relpos_jax.schemes.base import Scheme, Tile, register

EPSILON = 1e-2  # the clamp that keeps r1 and r2 positive


@register
class Kerple(Scheme):
    name = "kerple"

    def layer_params(self, cfg: Any, rngs: nnx.Rngs) -> dict[str, Any]:
        n = cfg.n_heads
        return {
            "kerple_r1": nnx.Param(jax.random.uniform(rngs.params(), (n,), jnp.float32, 0.0, 2.0)),
            "kerple_r2": nnx.Param(jax.random.uniform(rngs.params(), (n,), jnp.float32, 0.0, 1.0)),
        }

    def bias(self, attention, tile: Tile, context) -> jax.Array:
        r1 = jnp.maximum(attention.kerple_r1[...], EPSILON)[:, None, None]
        r2 = jnp.maximum(attention.kerple_r2[...], EPSILON)[:, None, None]
        distance = jnp.abs(tile.q_pos[:, None] - tile.k_pos[None, :]).astype(jnp.float32)
        return -r1 * jnp.log1p(r2 * distance)  # [N, I, J]
