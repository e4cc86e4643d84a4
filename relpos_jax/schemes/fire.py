"""FIRE (Li et al., ICLR 2024, "Functional Interpolation for Relative Positions Improves Long Context
Transformers"): a learned function of the distance, progressively interpolated by the query's
position,

    b(i, j) = f_θ( ψ(i − j) / ψ(max(L, i)) ),        ψ(x) = log(c·x + 1),

with ``f_θ`` an MLP from a scalar to one bias per head (one hidden layer of 32 ReLU units), and ``c``
and the threshold ``L`` learned (initialised to 0.1 and 512, the paper's and its reference code's
defaults), per layer, added to the logits after scaling. ``i`` is the query's position, which here
counts from the oldest key it can see (the model's positions); so FIRE is not translation
invariant, and is tested against a float64 loop of this formula. Future keys (i < j), which the mask
removes anyway, are scored at distance 0, so that no NaN reaches the masked entries' gradients.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
from flax import nnx

from relpos_jax.schemes.base import Scheme, Tile, normal_param, register

HIDDEN = 32  # the MLP's width
INIT_C, INIT_L = 0.1, 512.0


@register
class Fire(Scheme):
    name = "fire"
    relative = False  # the normaliser depends on the query's own position

    def layer_params(self, cfg: Any, rngs: nnx.Rngs) -> dict[str, Any]:
        n, std = cfg.n_heads, cfg.init_std
        return {
            "fire_w1": normal_param(rngs, (HIDDEN,), 1.0, (None,)),  # a scalar input: unit scale
            "fire_b1": nnx.Param(jnp.zeros((HIDDEN,), jnp.float32)),
            "fire_w2": normal_param(rngs, (HIDDEN, n), std, (None, "heads")),
            "fire_b2": nnx.Param(jnp.zeros((n,), jnp.float32)),
            "fire_c": nnx.Param(jnp.asarray(INIT_C, jnp.float32)),
            "fire_L": nnx.Param(jnp.asarray(INIT_L, jnp.float32)),
        }

    def context(self, model, q_pos, k_pos, deterministic) -> dict[str, Any]:
        # where the kernels count the queries from (float: every leaf of the context is a
        # parameter to the tiled path, which differentiates it, here to no effect)
        return {"first_query": q_pos[0].astype(jnp.float32)}

    def distance_tables(self, attention, context, count: int):
        """Not a table: the kernels evaluate the bias in each tile from these parameters."""
        return {
            "fire": {
                "c": jnp.abs(attention.fire_c[...]), "threshold": jnp.abs(attention.fire_L[...]),
                "first_query": context["first_query"], "w1": attention.fire_w1[...],
                "b1": attention.fire_b1[...], "w2_HN": attention.fire_w2[...],
                "b2_N": attention.fire_b2[...],
            }
        }  # fmt: skip

    def bias(self, attention, tile: Tile, context) -> jax.Array:
        c, threshold = jnp.abs(attention.fire_c[...]), jnp.abs(attention.fire_L[...])
        q_pos = tile.q_pos.astype(jnp.float32)
        distance = jnp.maximum(q_pos[:, None] - tile.k_pos[None, :].astype(jnp.float32), 0.0)
        normaliser = jnp.log1p(c * jnp.maximum(threshold, q_pos))  # ψ(max(L, i)) [I]
        x_IJ = jnp.log1p(c * distance) / normaliser[:, None]
        hidden = jax.nn.relu(x_IJ[..., None] * attention.fire_w1[...] + attention.fire_b1[...])
        bias_IJN = hidden @ attention.fire_w2[...] + attention.fire_b2[...]
        return jnp.moveaxis(bias_IJN, -1, 0)  # [N, I, J]
