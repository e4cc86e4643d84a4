"""The copy probe: a random string, then the same string 96 bytes later; 64-byte segments, 64 slots.

Every copied letter is an answer, so this probe gives far more training signal than the passkey (5
answer bytes in ~150) and a 2-layer model learns to copy in a few hundred steps when memory lets it
see the original; with ``mem_len=0`` the original is never in view and accuracy stays at 1/26.
"""

from __future__ import annotations

from configs import probe_passkey


def get_config():
    c = probe_passkey.get_config()
    c.data.name = "probe:copy:96"
    c.train.steps = 1000
    return c
