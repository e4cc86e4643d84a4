"""Small builders the tests share."""

from __future__ import annotations

from flax import nnx

from relpos_jax import TransformerLM


def tiny_model(position: str, seed: int = 0, **overrides) -> TransformerLM:
    """A 2-layer model small enough for loops, with tables sized so that short tests reach their
    clamped and log-bucketed rows; ``init_std`` large enough that positions change the logits."""
    config = dict(
        position=position,
        n_layers=2,
        d_model=32,
        n_heads=4,
        d_ff=64,
        mem_len=5,
        dropout=0.0,
        init_std=0.3,
        shaw_max_distance=3,
        t5_num_buckets=8,
        t5_max_distance=12,
        deberta_bucket_size=4,
        deberta_max_position=16,
        max_len=64,
    )
    config.update(overrides)
    return TransformerLM(config, rngs=nnx.Rngs(seed))
