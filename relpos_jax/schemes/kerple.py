"""KERPLE, logarithmic variant (Chi et al., NeurIPS 2022, "Kernelized Relative Positional Embedding
for Length Extrapolation"): a conditionally positive definite kernel of the distance as the bias,

    b(i, j) = −r1 · log(1 + r2 · |i − j|),        r1, r2 > 0 learned per head,

added to the logits after scaling, like ALiBi (which it generalises: a logarithmic instead of a linear
decay). As the authors' code (github.com/chijames/KERPLE at 25be3d7, ``ParallelKerpleLog`` in
``megatron/mpu/layers.py``):

* one pair (r1, r2) shared by every layer: ``gpt2_model.py`` builds one ``ParallelKerpleLog`` and
  hands that module to each layer (``model.kerple_per_layer=True``: a pair per layer instead);
* r1 and r2 start uniform in (0, 2) and (0, 1) (``torch.rand · 2``, ``· 1``);
* they stay ≥ 1e-2 by clamping the stored values (``param.data.clamp_(min=eps)`` before each
  forward): here ``Scheme.floors`` projects them after every optimizer update (and at init), and the
  forward reads them through ``floored``, so that a parameter at the floor keeps its gradient (a
  ``max`` in the forward would give it none).
"""

from __future__ import annotations

from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from relpos_jax.schemes.base import Scheme, Tile, floored, register

EPSILON = 1e-2  # the floor that keeps r1 and r2 positive (the authors' eps)
NAMES = ("kerple_r1", "kerple_r2")


@register
class Kerple(Scheme):
    name = "kerple"
    floors = dict.fromkeys(NAMES, EPSILON)
    must_match = ("per_layer",)
    renamed: ClassVar[dict[str, str]] = {"kerple_per_layer": "per_layer"}

    def config(self) -> ml_collections.ConfigDict:
        # r1, r2 per layer (False: one pair shared by every layer, as the authors' code)
        return ml_collections.ConfigDict({"per_layer": False})

    def _params(self, cfg: Any, rngs: nnx.Rngs) -> dict[str, Any]:
        n = cfg.n_heads
        r1 = jax.random.uniform(rngs.params(), (n,), jnp.float32, 0.0, 2.0)
        r2 = jax.random.uniform(rngs.params(), (n,), jnp.float32, 0.0, 1.0)
        return {  # stored at or above the floor from the start, as the first clamp leaves them
            name: nnx.Param(jnp.maximum(r, EPSILON))
            for name, r in zip(NAMES, (r1, r2), strict=True)
        }

    def shared_params(self, cfg: Any, rngs: nnx.Rngs) -> dict[str, Any]:
        return {} if cfg.kerple.per_layer else self._params(cfg, rngs)

    def layer_params(self, cfg: Any, rngs: nnx.Rngs) -> dict[str, Any]:
        return self._params(cfg, rngs) if cfg.kerple.per_layer else {}

    def context(self, model, q_pos, k_pos, deterministic) -> dict[str, Any] | None:
        if model.config.kerple.per_layer:
            return None
        return {name: getattr(model.position, name)[...] for name in NAMES}

    def bias(self, own, tile: Tile, context) -> jax.Array:
        source = context if context is not None else {n: getattr(own, n)[...] for n in NAMES}
        r1, r2 = (floored(source[name], EPSILON)[:, None, None] for name in NAMES)
        distance = jnp.abs(tile.q_pos[:, None] - tile.k_pos[None, :]).astype(jnp.float32)
        return -r1 * jnp.log1p(r2 * distance)  # [N, I, J]
