"""txl_small with the `xpos` position scheme; everything else equal, for side-by-side comparisons."""

from __future__ import annotations

from configs import txl_small


def get_config():
    c = txl_small.get_config()
    c.model.position = "xpos"
    return c
