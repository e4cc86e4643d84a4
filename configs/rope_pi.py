"""rope_small fine-tuned by position interpolation (Chen et al. 2023, "Extending Context Window of Large
Language Models via Positional Interpolation") at ``factor`` × its trained length:
``--config configs/rope_pi.py:4 --config.train.init_from=runs/<a rope_small run>``.

Positions are scaled by 1 / factor (``rope_scaling`` linear), segments are factor × longer with
factor × fewer rows (the same tokens a step), and the learning rate is a tenth of pretraining's with
a short warm-up, as the paper's fine-tune (1,000 steps at 2e-5 after LLaMA's 3e-4) is short and gentle.
"""

from __future__ import annotations

from configs import rope_small


def get_config(factor: str = "4"):
    c = rope_small.get_config()
    scale = int(factor)
    c.model.rope_scaling = {"rope_type": "linear", "factor": float(scale)}
    c.data.update(
        segment_len=c.data.segment_len * scale, batch_size=max(1, c.data.batch_size // scale)
    )
    c.train.update(steps=50, lr=c.train.lr / 10, warmup_steps=5, eval_every=0, ckpt_every=50)
    return c
