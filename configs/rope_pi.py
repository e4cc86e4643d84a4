"""rope_small fine-tuned at ``factor`` × its trained length, by position interpolation (Chen et al.
2023, "Extending Context Window of Large Language Models via Positional Interpolation") or by
another RoPE length extension (YaRN's Table 1 fine-tunes PI, NTK-aware and YaRN alike):

    --config configs/rope_pi.py:4 --config.train.init_from=runs/<a rope_small run>
    --config configs/rope_pi.py:4,yarn,64 ...   (extension, and the length the run was trained at)

``factor[,extension[,trained length]]``: the extension is one of ``rope_stretch.STRETCHES``
(default ``linear``: positions scaled by 1 / factor); the trained length (default rope_small's
segment) is YaRN's and Llama 3's L₀. Segments are factor × longer with factor × fewer rows (the same
tokens a step), and the learning rate is a tenth of pretraining's with a short warm-up, as the
paper's fine-tune (1,000 steps at 2e-5 after LLaMA's 3e-4) is short and gentle.
"""

from __future__ import annotations

from configs import rope_small
from relpos_jax.positions.rope_stretch import stretched


def get_config(spec: str = "4"):
    c = rope_small.get_config()
    parts = spec.split(",")
    if not 1 <= len(parts) <= 3 or not all(p.isdigit() for p in parts[::2]):
        raise ValueError(
            f"{spec!r} is not factor[,extension[,trained length]]; use e.g. 4 or 4,yarn,64"
        )
    scale, kind = int(parts[0]), parts[1] if len(parts) > 1 else "linear"
    trained_len = int(parts[2]) if len(parts) > 2 else c.data.segment_len
    c.model.rope_scaling = stretched(kind, scale, trained_len)
    c.data.update(
        segment_len=c.data.segment_len * scale, batch_size=max(1, c.data.batch_size // scale)
    )
    c.train.update(steps=50, lr=c.train.lr / 10, warmup_steps=5, eval_every=0, ckpt_every=50)
    return c
