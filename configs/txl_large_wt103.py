"""The paper's large WikiText-103 model (kimiyoung/transformer-xl ``pytorch/run_wt103_large.sh``;
``tf/scripts/wt103_large_tpu.sh`` trained the released model).

18 layers, d_model 1024, 16 heads of 64, d_inner 4096, dropout 0.2, dropatt 0.2; adaptive input and
softmax over the 267,735 words with cutoffs 20k/40k/200k, div_val 4 (d_embed 1024, then 256, 64,
16), tables tied, projections tied but the first (``tie_projs``; the TF script's
``proj_share_all_but_first``); one u/v pair per layer (``txl.untie_r``, as the TF script and the
released weights have it; the PyTorch code shares one pair); tgt_len 384, mem_len 384, batch 128,
4M steps of Adam 2.5e-4 after 16k warm-up steps, cosine to 0, clip 0.25. Test evaluation:
segment 128, memory 1600, clamp_len 1000, same_length -> 18.3 perplexity in the paper (Table 1).
Needs WikiText-103: ``--config.data.path=/path/to/wikitext-103-v1.zip`` (or the unzipped folder).
"""

from __future__ import annotations

from configs import base


def get_config():
    c = base.get_config()
    c.model.update(
        position="txl",
        vocab_size=267_735,
        n_layers=18,
        d_model=1024,
        n_heads=16,
        d_ff=4096,
        dropout=0.2,
        dropatt=0.2,
        mem_len=384,
        txl=dict(untie_r=True),
        cutoffs=(20_000, 40_000, 200_000),
        div_val=4,
        d_embed=1024,
        tie_projs=(False, True, True, True),
    )
    c.data.update(name="wikitext103", segment_len=384, batch_size=128)
    c.train.update(
        steps=4_000_000,
        lr=2.5e-4,
        warmup_steps=16_000,
        clip=0.25,
        log_every=200,
        eval_every=4000,
        eval_tokens=0,
        ckpt_every=4000,
    )
    c.eval.update(segment_len=128, mem_len=1600, clamp_len=1000, same_length=True, batch_size=10)
    return c
