"""xPos (Sun et al. 2023, "A Length-Extrapolatable Transformer", ACL; torchscale's ``XPOS``): RoPE
whose rotation also scales, so that attention decays with distance,

    q̃_n = ζ^{n/γ} ⊙ R_n q_n,      k̃_m = ζ^{−m/γ} ⊙ R_m k_m,

so that pair ``i`` of ``q̃_nᵀk̃_m`` is RoPE's times ``ζ_i^{(n−m)/γ}``; one ``ζ_i = (2i/R + g) / (1 + g)`` per rotated pair ``i`` of the ``R`` rotated dims (``g`` is
``model.xpos.gamma``, 0.4; ``γ`` is ``model.xpos.scale_base``, 512, torchscale's defaults). Each
pair's factor ``ζ_i < 1`` makes its term shrink as the distance grows, the slower the higher ``i``
(the low frequencies, which carry long-range information, decay least). The rotation is RoPE's (its
``model.rope_*`` fields: base, scaling, fraction, layout).

Scores depend on ``n − m`` only, so the scales are taken at window offsets centred on the window's
middle (torchscale centres them likewise): the exponents stay within ``±K/(2γ)``, and neither scale
underflows or overflows in float32 for windows far past the training length.
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import ml_collections

from relpos_jax.errors import fail
from relpos_jax.schemes.base import register
from relpos_jax.schemes.rope import RoPE


def decay(rotated_pairs: int, gamma: float) -> jax.Array:
    """``ζ [R/2]``: each rotated pair's decay per ``scale_base`` of distance (torchscale:
    ``(arange(0, R, 2) + gamma · R) / ((1 + gamma) · R)``)."""
    width = 2 * rotated_pairs
    return (jnp.arange(0, width, 2) + gamma * width) / ((1 + gamma) * width)


@register
class XPos(RoPE):
    name = "xpos"

    def config(self) -> ml_collections.ConfigDict:
        own = ml_collections.ConfigDict()
        own.gamma = 0.4  # ζ_i = (2i/R + gamma) / (1 + gamma): the fastest pair's decay
        own.scale_base = 512.0  # γ: the distance over which a pair's term shrinks by ζ_i
        return own

    def check_settings(self, own: Any) -> None:
        if not own.gamma > 0:
            fail("model.xpos.gamma", own.gamma, "use a positive offset such as 0.4")
        if not own.scale_base > 0:
            fail("model.xpos.scale_base", own.scale_base, "use a positive length such as 512")

    def context(self, model, q_pos, k_pos, deterministic) -> dict[str, Any]:
        context = super().context(model, q_pos, k_pos, deterministic)
        own, k_len = model.config.xpos, k_pos.shape[0]
        mem_len = k_len - q_pos.shape[0]
        cos, sin = context["k"]
        with jax.ensure_compile_time_eval():
            zeta = decay(cos.shape[-1], own.gamma).astype(cos.dtype)
            offsets = (jnp.arange(k_len) - k_len // 2).astype(cos.dtype) / own.scale_base
            up = zeta ** offsets[:, None]  # [K, R/2]: ζ^{n/γ} for the queries, 1/that for keys
        q_up = up[mem_len:]
        return {"k": (cos / up, sin / up), "q": (cos[mem_len:] * q_up, sin[mem_len:] * q_up)}
