"""The needle probe: a digit, filler, then "key?" and the same digit 8 … 96 bytes later (a mixture).

Segments of 64 bytes and 64 memory slots. Needles closer than the query's place in its segment are
answerable without memory: that is where a 2-layer model learns the single attention hop by content
(the question mark and the digits occur nowhere else) within a few hundred steps. Needles further
back than the segment can only be answered from memory: with ``mem_len=0`` accuracy there stays at
chance (1 digit in 10). ``bench/probes.py --config configs/probe_needle.py`` trains both and plots
accuracy against distance.
"""

from __future__ import annotations

from configs import probe_passkey


def get_config():
    c = probe_passkey.get_config()
    c.data.update(name="probe:needle:8-96", batch_size=32)
    c.train.update(steps=2000, lr=3e-3)
    return c
