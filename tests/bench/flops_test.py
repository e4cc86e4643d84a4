"""``bench.mfu``'s FLOPs count (the figure beside every MFU and in the TPU table) against XLA's."""

from __future__ import annotations

from types import SimpleNamespace

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from bench.mfu import output_flops
from relpos_jax.adaptive import AdaptiveVocab

N = 64  # positions scored, one chunk (XLA counts a loop's body once)


@pytest.mark.parametrize("div_val,d_embed", [(1, 256), (1, 384), (4, 256), (2, 512)])
def test_the_output_layer_count_is_the_compilers(div_val, d_embed):
    """The adaptive softmax's forward matrix products, every cluster scored for every position
    (``AdaptiveVocab.log_prob``, projections included): XLA's count of the compiled call, less at
    most 5 FLOPs a logit for the log-softmax beside them (a cluster, or a projection of width 64 or
    more, left out of the count would exceed that)."""
    vocab, d, cutoffs = 3000, 256, (200, 600, 1500)
    module = AdaptiveVocab(vocab, d, cutoffs, d_embed=d_embed, div_val=div_val, rngs=nnx.Rngs(0))
    model = SimpleNamespace(
        d_model=d, cutoffs=cutoffs, vocab_size=vocab, d_embed=d_embed, div_val=div_val
    )
    hidden, targets = jnp.ones((N, d)), jnp.arange(N) * 37 % vocab
    compiled = jax.jit(lambda h, t: module.log_prob(h, t)).lower(hidden, targets).compile()
    cost = compiled.cost_analysis()
    counted = (cost[0] if isinstance(cost, list) else cost)["flops"]
    expected = output_flops(model) * N
    logits = N * (vocab + len(cutoffs))
    assert 0 <= counted - expected <= 5 * logits


def test_a_byte_model_scores_every_byte():
    model = SimpleNamespace(d_model=512, cutoffs=(), vocab_size=256, d_embed=None, div_val=1)
    assert output_flops(model) == 2 * 512 * 256
