"""The paper's 12-layer enwik8 model (kimiyoung/transformer-xl pytorch/run_enwik8_base.sh).

12 layers, d_model 512, 8 heads of 64, d_inner 2048, dropout 0.1, dropatt 0, tgt_len 512, mem_len 512,
batch 22, 400k steps, Adam 2.5e-4 without warm-up, cosine to 0, clip 0.25. Test evaluation: segment 80,
memory 2100, clamp_len 820, same_length -> 1.06 bpc in the paper. Needs enwik8:
``--config.data.path=/path/to/enwik8.zip``.
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
    c.data.update(name="enwik8", segment_len=512, batch_size=22)
    c.train.update(
        steps=400_000,
        lr=2.5e-4,
        warmup_steps=0,
        clip=0.25,
        log_every=200,
        eval_every=4000,
        eval_tokens=0,
        ckpt_every=4000,
    )
    c.eval.update(segment_len=80, mem_len=2100, clamp_len=820, same_length=True, batch_size=10)
    return c
