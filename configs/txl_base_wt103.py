"""The paper's base WikiText-103 model (kimiyoung/transformer-xl ``pytorch/run_wt103_base.sh``).

16 layers, d_model 410, 10 heads of 41, d_inner 2100, dropout 0.1, dropatt 0; adaptive input and
softmax over the 267,735 words with cutoffs 20k/40k/200k, div_val 1, embeddings and projections tied
(``pytorch/train.py``: ``tie_projs = [False] + [True] * 3``); tgt_len 150, mem_len 150, batch 60,
200k steps of Adam 2.5e-4 without warm-up, cosine to 0, clip 0.25. Test evaluation: segment 64,
memory 640, clamp_len 400, same_length -> 24.0 perplexity in the paper (Table 1). Needs WikiText-103:
``--config.data.path=/path/to/wikitext-103-v1.zip`` (or the unzipped folder).
"""

from __future__ import annotations

from configs import base


def get_config():
    c = base.get_config()
    c.model.update(
        position="txl",
        vocab_size=267_735,
        n_layers=16,
        d_model=410,
        n_heads=10,
        d_ff=2100,
        dropout=0.1,
        dropatt=0.0,
        mem_len=150,
        cutoffs=(20_000, 40_000, 200_000),
        div_val=1,
        tie_projs=(False, True, True, True),
    )
    c.data.update(name="wikitext103", segment_len=150, batch_size=60)
    c.train.update(
        steps=200_000,
        lr=2.5e-4,
        warmup_steps=0,
        clip=0.25,
        log_every=200,
        eval_every=4000,
        eval_tokens=0,
        ckpt_every=4000,
    )
    c.eval.update(segment_len=64, mem_len=640, clamp_len=400, same_length=True, batch_size=10)
    return c
