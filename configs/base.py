"""Every config field, commented, with its default. Other configs start from this one.

Override any field on the command line: ``--config configs/txl_small.py --config.model.mem_len=256``.
A scheme's own settings, ``model.<scheme>.<field>`` (``--config.model.shaw.max_distance=32``), are
declared with their defaults and comments in its module, ``relpos_jax/schemes/<scheme>.py``.
"""

from __future__ import annotations

import ml_collections
from ml_collections import config_dict

from relpos_jax import schemes


def get_config() -> ml_collections.ConfigDict:
    c = ml_collections.ConfigDict()

    c.model = m = ml_collections.ConfigDict()
    m.position = "txl"  # a registered scheme: txl | shaw | t5 | alibi | rope | sinusoid | …
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
    m.pre_norm = False  # the paper is post-norm
    m.remat = False  # recompute each layer's activations in the backward pass (less memory)
    m.scan_unroll = 1  # layers an iteration of the layers' scan; n_layers unrolls them all
    m.tie_embeddings = True  # output projection = input embedding transposed
    m.output_bias = False  # tied plain softmax: a bias per token too (the official code has one)
    # Adaptive input and softmax (word-level vocabularies; relpos_jax.adaptive): the vocabulary,
    # ordered by frequency, cut into clusters at these ids; () is one plain softmax.
    m.cutoffs = ()  # e.g. (20000, 40000, 200000) for WikiText-103
    m.div_val = 1  # cluster i embeds in d_embed // div_val**i dimensions
    m.d_embed = config_dict.placeholder(int)  # None: d_model
    m.tie_projs = ()  # per cluster: the output projection is the input one (): none tied
    m.init_std = 0.02
    # the rotary schemes' (rope and its kin): flat, as model.rope_scaling is in the public contract
    m.rope_base = 10000.0
    m.rope_scaling = config_dict.placeholder(dict)  # HuggingFace rope_scaling dict, e.g. yarn
    m.rope_fraction = 1.0  # partial rotary: fraction of each head that rotates
    m.rope_interleaved = False  # pairs (2i, 2i+1) instead of rotate-half
    m.dtype = "float32"  # compute dtype: float32 | bfloat16 (parameters stay float32)
    # dense: the [T, K] logits at once | tiled: key tiles, online softmax | kernel: the Pallas
    # kernels (GPU, TPU; interpreted on a CPU) | auto: kernel on GPU/TPU, else dense or tiled by length
    m.attention_impl = "dense"
    m.key_tile = 512  # tiled: keys per tile
    m.query_tile = 512  # tiled: queries per tile (a layer holds query_tile·key_tile logits a head)
    m.kernel_block = 0  # kernel: queries and keys per block (0: 64 on GPU, 128 on TPU)
    for name in schemes.names():  # model.<scheme>.<field>: each scheme's own settings
        if (own := schemes.get(name).config()) is not None:
            m[name] = own

    c.data = d = ml_collections.ConfigDict()
    d.name = "pystdlib"  # pystdlib (embedded) | text | enwik8 | text8 | wikitext103 | tfds:<name>
    d.path = config_dict.placeholder(str)  # file, folder or zip for text / enwik8 / wikitext103 …
    d.tokens = config_dict.placeholder(str)  # bytes | words | symbols (None: words for wikitext,
    #   else bytes; symbols: enwik8 / text8 numbered as the official code, for its released models)
    d.vocab = config_dict.placeholder(str)  # words: vocabulary file (one per line), not train's
    d.partition = "dedup"  # pystdlib: dedup (near-duplicates in train, valid ≈ test) | hash (older)
    d.python = config_dict.placeholder(str)  # pystdlib: whose standard library, "3.11" (None: this
    #   Python's); another version's is read from data.dir, where that Python built it
    d.dir = config_dict.placeholder(
        str
    )  # where built datasets live (default ~/.cache/relpos_jax/tfds)
    d.segment_len = 128  # tokens per training segment (tgt_len)
    d.batch_size = 16  # rows, each a contiguous stream (global, over all processes)

    c.train = t = ml_collections.ConfigDict()
    t.steps = 1000
    t.lr = 2.5e-4  # peak learning rate
    t.warmup_steps = 0  # linear warm-up, then cosine decay to train.min_lr_ratio · lr
    t.min_lr_ratio = 0.0
    t.optimizer = "adam"  # adam | adamw
    t.weight_decay = 0.0  # adamw only
    t.b1 = 0.9
    t.b2 = 0.999
    t.clip = 0.25  # global gradient-norm clip (the paper's); 0 disables
    t.grad_accum = 1  # split each batch into this many micro-batches (same result, less memory)
    t.seed = 0
    # the first position of each segment whose loss trains the model: 0, every position (the full
    # loss); data.segment_len // 2, the recent half (Dai et al.'s "half loss" for absolute
    # encodings: no training on positions that see little context)
    t.loss_from = 0
    # a run folder whose newest checkpoint's model starts this run (a fine-tune: a fresh optimizer,
    # data and schedule; e.g. RoPE's position interpolation at a longer data.segment_len)
    t.init_from = config_dict.placeholder(str)
    t.log_every = 50
    t.eval_every = 500  # validation during training (0: only at the end)
    t.eval_tokens = 131072  # validation tokens scored during training (0: the whole split)
    t.ckpt_every = 500
    t.keep_checkpoints = 3  # the newest N; a corrupt newest one falls back to the one before
    t.skip_nonfinite = False  # False: a NaN/Inf loss or gradient stops the run (checkpoint kept)
    #   True: such a step changes nothing (parameters, optimizer, memory reset) and is counted
    t.max_consecutive_skips = 10  # with skip_nonfinite: stop after this many bad steps in a row

    c.eval = e = ml_collections.ConfigDict()
    e.segment_len = config_dict.placeholder(int)  # None: data.segment_len
    e.mem_len = config_dict.placeholder(int)  # None: model.mem_len
    e.clamp_len = config_dict.placeholder(int)  # None: model.clamp_len
    e.same_length = config_dict.placeholder(bool)  # None: model.same_length
    e.batch_size = 16
    e.lengths = ()  # evaluation segment lengths for sweeps (extrapolation)

    c.mesh = ms = ml_collections.ConfigDict()
    ms.data = -1  # device mesh axis sizes; -1 takes the devices left
    ms.fsdp = 1
    ms.tensor = 1
    ms.context = 1  # the segment and memory split into blocks (context parallelism; tiled only)
    return c
