"""A memory probe: passkey retrieval 96 bytes back, with 64-byte segments and 64 memory slots.

The answer lies beyond the segment, so only memory can reach it: ``mem_len=0`` stays at chance
(1 digit in 10). A 2-layer Transformer-XL (two layers make induction-style copying possible) that
trains in a few minutes on a 2-core CPU. ``python -m experiments.probes`` trains it with and without memory and
plots accuracy against distance.
"""

from __future__ import annotations

from configs import base


def get_config():
    c = base.get_config()
    c.model.update(
        position="txl", n_layers=2, d_model=128, n_heads=4, d_ff=512, mem_len=64, dropout=0.0
    )
    c.data.update(name="probe:passkey:96", segment_len=64, batch_size=16)
    c.train.update(
        steps=1500,
        lr=1e-3,
        warmup_steps=50,
        clip=0.25,
        log_every=50,
        eval_every=0,
        eval_tokens=32768,
        ckpt_every=500,
    )
    return c
