"""The paper's 24-layer enwik8 model (kimiyoung/transformer-xl ``tf/scripts/enwik8_tpu.sh``, which
trained it on TPUs; 0.99 bpc, 277M parameters, in the paper's Table 2).

24 layers, d_model 1024, 8 heads of 128, d_inner 3072, dropout 0.15, dropatt 0.15, tgt_len 768,
mem_len 768, train_batch_size 64, 400k steps of Adam 2.5e-4 after 4,000 warm-up steps, cosine to 0,
clip 0.25. Test evaluation: segment 128, memory 3,800, clamp_len 1,000, same_length, batch 16. Needs
enwik8: ``--config.data.path=/path/to/enwik8.zip``. Which TPU slices it fits, with which mesh:
``docs/benchmarks/aot.md`` (``python -m bench.aot``).
"""

from __future__ import annotations

from configs import base


def get_config():
    c = base.get_config()
    c.model.update(
        position="txl",
        n_layers=24,
        d_model=1024,
        n_heads=8,
        d_head=128,
        d_ff=3072,
        dropout=0.15,
        dropatt=0.15,
        mem_len=768,
    )
    c.data.update(name="enwik8", segment_len=768, batch_size=64)
    c.train.update(
        steps=400_000,
        lr=2.5e-4,
        warmup_steps=4000,
        clip=0.25,
        log_every=200,
        eval_every=4000,
        eval_tokens=0,
        ckpt_every=4000,
    )
    c.eval.update(segment_len=128, mem_len=3800, clamp_len=1000, same_length=True, batch_size=16)
    return c
