"""The paper's 12-layer enwik8 model (kimiyoung/transformer-xl pytorch/run_enwik8_base.sh).

12 layers, d_model 512, 8 heads of 64, d_inner 2048, dropout 0.1, dropatt 0, tgt_len 512,
mem_len 512; evaluated with tgt 80, mem 2100, clamp 820, same_length -> 1.06 bpc.
"""

from __future__ import annotations

from configs import base


def get_config():
    c = base.get_config()
    c.model.update(
        position="txl",
        n_layers=12,
        d_model=512,
        n_heads=8,
        d_ff=2048,
        dropout=0.1,
        dropatt=0.0,
        mem_len=512,
    )
    return c
