"""Every config field, commented, with its default. Other configs start from this one.

Override any field on the command line: ``--config configs/txl_small.py --config.model.mem_len=256``.
"""

from __future__ import annotations

import ml_collections
from ml_collections import config_dict


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()

    c.model = m = ml_collections.ConfigDict()
    m.position = "txl"  # txl | shaw | t5 | alibi | rope | sinusoid | learned | deberta | none
    m.vocab_size = 256  # bytes
    m.n_layers = 6
    m.d_model = 256
    m.n_heads = 4
    m.d_head = config_dict.placeholder(int)  # None: d_model // n_heads
    m.d_ff = 1024
    m.dropout = 0.1  # embeddings, attention output, feed-forward, final hidden
    m.dropatt = 0.0  # attention probabilities
    m.mem_len = 128  # memory slots per layer (0: no recurrence)
    m.same_length = False  # every query sees the same number of keys (mem_len + 1)
    m.clamp_len = config_dict.placeholder(int)  # txl: cap relative distances (None: no cap)
    m.untie_r = False  # txl: one u/v pair per layer instead of one shared pair
    m.pre_norm = False  # the paper is post-norm
    m.tie_embeddings = True  # output projection = input embedding transposed
    m.init_std = 0.02
    m.max_len = 4096  # learned: rows of the absolute table (longer positions reuse the last)
    m.rope_base = 10000.0
    m.rope_scaling = config_dict.placeholder(dict)  # HuggingFace rope_scaling dict, e.g. yarn
    m.rope_fraction = 1.0  # partial rotary: fraction of each head that rotates
    m.rope_interleaved = False  # pairs (2i, 2i+1) instead of rotate-half
    m.shaw_max_distance = 64  # shaw: k, the table has 2k + 1 rows
    m.t5_num_buckets = 32
    m.t5_max_distance = 128
    m.deberta_bucket_size = 256
    m.deberta_max_position = 512
    return c
