"""The default research config: a 6-layer Transformer-XL that trains on a 2-core CPU in ~10 minutes.

Sizes: 6 layers, d_model 256, 4 heads of 64, d_ff 1024, segment 128, memory 128, batch 16 (2,048
tokens a step, ~1M tokens in 500 steps: a tenth of an epoch of pystdlib, so no dropout is needed).
Tuned for the best bpc in that budget: Adam 1e-3 with 50 warm-up steps, cosine to 0, clip 0.25.
"""

from __future__ import annotations

from configs import base


def get_config():
    c = base.get_config()
    c.model.update(
        position="txl", n_layers=6, d_model=256, n_heads=4, d_ff=1024, mem_len=128, dropout=0.0
    )
    c.data.update(name="pystdlib", segment_len=128, batch_size=16)
    c.train.update(
        steps=500,
        lr=1e-3,
        warmup_steps=50,
        clip=0.25,
        log_every=25,
        eval_every=250,
        eval_tokens=65536,
        ckpt_every=250,
    )
    return c
