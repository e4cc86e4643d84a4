"""Transformer-XL's "PPL init" and "PPL best" (Dai et al. 2019, Table 6) from per-token losses at
several evaluation contexts: a model at the context it was trained with (init), at the context that
scores best (best, the shortest such one: Table 6's "Attn Len"), and whether best beats init beyond
chance.

The losses are ``relpos_jax.analysis.context_losses``' (the same tokens at every context, each model
scored as it was trained). The gain best − init is in bits per token, with a percentile bootstrap
over blocks of ``block`` consecutive scored tokens, paired (the same blocks at both contexts:
``relpos_jax.analysis.bootstrap.difference``). The best context is chosen on the same tokens the
interval resamples, so an interval that excludes zero is a little optimistic when several contexts
are close: read it as "the longer context helps", not as the size of the help.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from relpos_jax.analysis import bootstrap


def _blocked(losses: np.ndarray, block: int) -> bootstrap.Scores:
    """One model's scores (``bootstrap.Scores``, bits) in blocks of ``block`` tokens (the last one
    may be shorter)."""
    bits = np.asarray(losses, np.float64) / math.log(2)
    starts = np.arange(0, bits.size, block)
    return bootstrap.Scores(np.add.reduceat(bits, starts)[None], np.diff([*starts, bits.size]))


def init_and_best(
    token_losses: Mapping[int, np.ndarray],
    trained: int,
    *,
    block: int,
    replicates: int = bootstrap.REPLICATES,
    seed: int = 0,
) -> dict:
    """``{"bpc": {c: bpc}, "init": trained, "best": c, "gain": [point, lo, hi]}`` from the per-token
    losses (nats) of one model at each context c; ``trained`` must be one of the contexts. ``best``
    is the context of the lowest bpc, the shortest on a tie; ``gain`` is bpc(best) − bpc(init) with
    its 95 % interval (zero when best is init)."""
    if trained not in token_losses:
        raise ValueError(
            f"init_and_best: the trained context {trained} is not among the contexts "
            f"{sorted(token_losses)}; score it too"
        )
    sizes = {np.asarray(v).size for v in token_losses.values()}
    if len(sizes) != 1 or 0 in sizes:
        raise ValueError(f"init_and_best: the contexts scored {sorted(sizes)} tokens; pass the "
                         "same tokens (at least one) at every context")  # fmt: skip
    if isinstance(block, bool) or not isinstance(block, int) or block < 1:
        raise ValueError(f"init_and_best: block={block!r} is invalid; use an int >= 1")
    bpc = {
        int(c): float(np.mean(v, dtype=np.float64)) / math.log(2)
        for c, v in sorted(token_losses.items())
    }
    best = min(bpc, key=lambda c: (bpc[c], c))
    if best == trained:
        gain = [0.0, 0.0, 0.0]
    else:
        at_best, at_init = (_blocked(token_losses[c], block) for c in (best, trained))
        d = bootstrap.difference(at_best, at_init, replicates=replicates, seed=seed)
        gain = [d.point, d.lo, d.hi]
    return {"bpc": {str(c): v for c, v in bpc.items()}, "init": trained, "best": best, "gain": gain}
