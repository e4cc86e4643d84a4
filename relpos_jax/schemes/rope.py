"""RoPE (Su et al. 2021) and its length extensions (PI, NTK, dynamic NTK, YaRN, Llama 3, LongRoPE):
queries and keys rotated by their positions, so that ``q·k`` depends on ``q_pos − k_pos``."""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp

from relpos_jax import positions as P
from relpos_jax.errors import fail
from relpos_jax.schemes.base import Scheme, register


@register
class RoPE(Scheme):
    name = "rope"
    content_carries_positions = True

    def validate(self, cfg: Any) -> None:
        try:
            P.rope_inv_freq(
                cfg.head_dim,
                cfg.rope_base,
                cfg.rope_scaling,
                partial_rotary_factor=cfg.rope_fraction,
            )
        except ValueError as error:
            head = "head_dim" in str(error)
            fail(
                "model.d_head" if head else "model.rope_scaling",
                cfg.head_dim if head else cfg.rope_scaling,
                f"RoPE refused it: {error}",
            )

    def context(self, model, q_pos, k_pos, deterministic) -> dict[str, Any]:
        # Scores depend only on q_pos − k_pos, so queries and keys are rotated by their offsets in
        # the window (0 … K − 1) instead of their stream positions: the same scores, and a table
        # that is a constant of the program. (XLA fuses the table into every layer's rotation, so a
        # table of traced positions costs two cosines per rotated element.)
        cfg = model.config
        k_len, mem_len = k_pos.shape[0], k_pos.shape[0] - q_pos.shape[0]
        with jax.ensure_compile_time_eval():
            inv_freq, factor = P.rope_inv_freq(
                cfg.head_dim,
                cfg.rope_base,
                cfg.rope_scaling,
                seq_len=k_len,
                partial_rotary_factor=cfg.rope_fraction,
            )
            dtype = jnp.result_type(float)  # float32; float64 in the x64 reference tests
            cos, sin = P.rope_cos_sin(jnp.arange(k_len), inv_freq, factor, dtype)
        return {"k": (cos, sin), "q": (cos[mem_len:], sin[mem_len:])}

    def rotate(self, attention, q, k, context):
        interleaved = attention.config.rope_interleaved
        q = P.rotate(q, *context["q"], interleaved=interleaved)
        if attention.kv_layout == "bknh":  # [B, K, N, H]
            k = P.rotate(k, *context["k"], interleaved=interleaved)
        else:  # [B, N, H, K]
            k = P.rotate_columns(k, *context["k"], interleaved=interleaved)
        return q, k
