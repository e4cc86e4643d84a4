"""The default research config: a 6-layer Transformer-XL that trains on a CPU in minutes."""

from __future__ import annotations

from configs import base


def get_config():
    c = base.get_config()
    c.model.update(position="txl", n_layers=6, d_model=256, n_heads=4, d_ff=1024, mem_len=128)
    return c
