"""The needle probe: a digit, filler, then "key?" and the same digit 8 … 48 bytes later (a mixture).

Segments of 16 bytes and 48 memory slots, so almost every needle lies beyond the segment: only memory
can reach it, and with ``mem_len=0`` accuracy beyond the segment stays at chance (1 digit in 10). The
question mark and the digits occur nowhere else, so one attention hop by content answers it; because
the distance varies, a fixed-offset head cannot. A 2-layer Transformer-XL can learn it in 2,000
steps (minutes on a 2-core CPU), though not with every seed. ``python -m experiments.probes`` trains every
scheme with this memory and with the key inside the segment, over seeds, and plots accuracy against
distance.
"""

from __future__ import annotations

from configs import probe_passkey


def get_config():
    c = probe_passkey.get_config()
    c.model.mem_len = 48
    c.data.update(name="probe:needle:8-48", segment_len=16, batch_size=64)
    c.train.update(steps=4000, lr=3e-3, ckpt_every=1000)
    return c
