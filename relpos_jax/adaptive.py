"""Adaptive input (Baevski & Auli 2019) and adaptive softmax (Grave et al. 2017) over one vocabulary,
as Transformer-XL's word-level models use them (the official code's ``AdaptiveEmbedding`` and
``ProjectedAdaptiveLogSoftmax``, whose parameters map one to one onto these).

The vocabulary, ordered by frequency, is cut at ``cutoffs`` into clusters: the shortlist
``[0, c_1)``, then ``[c_i, c_{i+1})``, the last ending at V. Cluster i has its own embedding table
``E_i [V_i, d_i]``, ``d_i = d_embed // div_val**i``, and projection ``P_i [d_proj, d_i]`` to the
model width ``d_proj`` (no projection where ``div_val = 1`` and ``d_embed = d_proj``).

* Input: token w of cluster i is ``E_i[w − c_i]·P_iᵀ·√d_proj``.
* Output: the head scores the shortlist and, per tail cluster, one logit; a tail scores its words:

      head   = (h·P'_0)·[W_0; W_c]ᵀ + [b_0; b_c]          tail_i = (h·P'_i)·W_iᵀ + b_i
      log p(w) = log softmax(head)[w]                                   w in the shortlist
      log p(w) = log softmax(head)[cluster i] + log softmax(tail_i)[w − c_i]   w in cluster i

  As in the official code, cluster i's logit is head column −i (the row ``n_clusters − i`` of
  ``W_c``). ``tie_weight``: the output tables W_i are the input tables E_i; ``tie_projs[i]``: the
  output projection P'_i is the input one P_i. Every word's probability is exact (no sampling);
  the log-probabilities over the vocabulary sum to one.

With ``div_val = 1`` there is one table ``[V, d_embed]`` (one projection on the input side), and
each cluster's output reads its rows of it. ``log_probs`` gives every word's log-probability
(``[N, V]``, what the model returns as its logits); ``log_prob`` only the targets', scoring the
tails in chunks of ``chunk`` positions (static shapes; one chunk's ``[chunk, V_i]`` logits live at
a time, recomputed in the backward pass).

Legend: N positions, D = d_proj (the model width), V vocabulary, C tail clusters.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence

import jax
import jax.numpy as jnp
from flax import nnx

from relpos_jax.errors import fail
from relpos_jax.ops import precision


def check(
    vocab_size: int, cutoffs: Sequence[int], div_val: int, d_embed: int, tie_projs=()
) -> None:
    """Refuse, in one line, cutoffs that do not cut the vocabulary into non-empty increasing
    clusters, a cluster without width, and tie_projs (when given) not one flag per cluster."""
    bounds = [0, *cutoffs, vocab_size]
    if any(a >= b for a, b in itertools.pairwise(bounds)):
        fail("model.cutoffs", list(cutoffs), f"use increasing ids in (0, {vocab_size})")
    if div_val < 1:
        fail("model.div_val", div_val, "use a positive integer (1: one embedding width)")
    if d_embed // div_val ** len(cutoffs) < 1:
        fail("model.div_val", div_val, f"d_embed={d_embed} leaves the last cluster no width")
    if tie_projs and len(tie_projs) != len(cutoffs) + 1:
        clusters = len(cutoffs) + 1
        fail("model.tie_projs", list(tie_projs), f"give one flag per cluster ({clusters})")


def _param(rngs: nnx.Rngs, shape, std: float, axes) -> nnx.Param:
    return nnx.Param(std * jax.random.normal(rngs.params(), shape, jnp.float32), axes=axes)


class AdaptiveVocab(nnx.Module):
    """The input embedding and the output distribution of an adaptive vocabulary."""

    def __init__(
        self,
        vocab_size: int,
        d_proj: int,
        cutoffs: Sequence[int],
        *,
        d_embed: int | None = None,
        div_val: int = 1,
        tie_weight: bool = True,
        tie_projs: Sequence[bool] | None = None,
        init_std: float = 0.02,
        chunk: int = 4096,
        rngs: nnx.Rngs,
    ):
        d_embed = d_proj if d_embed is None else d_embed
        check(vocab_size, cutoffs, div_val, d_embed, tie_projs)
        self.bounds = (0, *cutoffs, vocab_size)
        self.clusters = len(self.bounds) - 1
        self.div_val, self.d_proj, self.chunk = div_val, d_proj, chunk
        # clusters are projected to D: per-cluster widths, or one width other than D
        self.projected = div_val > 1 or d_embed != d_proj
        tie_projs = tuple(tie_projs) if tie_projs else (False,) * self.clusters
        self.tie_weight, self.tie_projs = tie_weight, tie_projs
        sizes = [b - a for a, b in itertools.pairwise(self.bounds)]
        widths = [d_embed // div_val**i for i in range(self.clusters)]
        tables = [(vocab_size, d_embed)] if div_val == 1 else list(zip(sizes, widths, strict=True))
        for i, shape in enumerate(tables):
            setattr(self, f"embed_{i}", _param(rngs, shape, init_std, ("vocab", None)))
            if not tie_weight:
                setattr(self, f"out_{i}", _param(rngs, shape, init_std, ("vocab", None)))
        for i, width in enumerate(widths if div_val > 1 else [d_embed]):
            if self.projected:
                setattr(self, f"proj_{i}", _param(rngs, (d_proj, width), init_std, ("embed", None)))
        for i in range(self.clusters):  # the output projections that are not the input's
            if self.projected and not tie_projs[i]:
                width = widths[i] if div_val > 1 else d_embed
                setattr(
                    self, f"out_proj_{i}", _param(rngs, (d_proj, width), init_std, ("embed", None))
                )
            setattr(self, f"bias_{i}", nnx.Param(jnp.zeros(sizes[i], jnp.float32), axes=("vocab",)))
        if self.clusters > 1:
            self.cluster_weight = _param(rngs, (self.clusters - 1, d_embed), init_std, (None, None))
            self.cluster_bias = nnx.Param(jnp.zeros(self.clusters - 1, jnp.float32), axes=(None,))

    # ------------------------------------------------------------------------------ structure

    def _table(self, i: int, output: bool) -> jax.Array:
        """Cluster i's rows ``[V_i, d_i]`` (the input table, or the output one when untied)."""
        name = "out" if output and not self.tie_weight else "embed"
        table = getattr(self, f"{name}_{0 if self.div_val == 1 else i}")[...]
        if self.div_val == 1 and output:
            table = table[self.bounds[i] : self.bounds[i + 1]]
        return table

    def _projection(self, i: int, output: bool) -> jax.Array | None:
        """Cluster i's projection ``[D, d_i]`` (the input's where ``tie_projs[i]``), or None. With
        ``div_val = 1`` the input side has one projection, which tied clusters share."""
        if not self.projected:
            return None
        if output and not self.tie_projs[i]:
            return getattr(self, f"out_proj_{i}")[...]
        return getattr(self, f"proj_{0 if self.div_val == 1 else i}")[...]

    # ---------------------------------------------------------------------------------- input

    def embed(self, tokens: jax.Array, dtype=jnp.float32) -> jax.Array:
        """Token ids ``[...]`` -> ``[..., D]`` in ``dtype``, scaled by √D."""
        t_N = tokens.reshape(-1)
        out = jnp.zeros((t_N.shape[0], self.d_proj), dtype)
        for i in range(self.clusters if self.div_val > 1 else 1):
            low, high = (0, self.bounds[-1]) if self.div_val == 1 else self.bounds[i : i + 2]
            rows = self._table(i, output=False)[jnp.clip(t_N - low, 0, high - low - 1)]
            rows = rows.astype(dtype)
            projection = self._projection(i, output=False)
            if projection is not None:
                rows = precision.einsum("ne,de->nd", rows, projection.astype(dtype))
            inside = (t_N >= low) & (t_N < high)
            out = out + jnp.where(inside[:, None], rows, jnp.zeros((), dtype))
        return (out * math.sqrt(self.d_proj)).astype(dtype).reshape(*tokens.shape, -1)

    # --------------------------------------------------------------------------------- output

    def _scores(self, h_ND: jax.Array, i: int, weight, bias) -> jax.Array:
        """``(h·P'_i)·Wᵀ + b`` in float32: ``[N, rows of W]``."""
        projection = self._projection(i, output=True)
        if projection is not None:
            h_ND = precision.einsum("nd,de->ne", h_ND, projection.astype(h_ND.dtype))
        logits = precision.einsum("ne,ve->nv", h_ND, weight.astype(h_ND.dtype), jnp.float32)
        return logits + bias.astype(jnp.float32)

    def _head_log_probs(self, h_ND: jax.Array) -> jax.Array:
        """``[N, V_0 + C]``: the shortlist's words, then the tail clusters in reverse order."""
        weight, bias = self._table(0, output=True), self.bias_0[...]
        if self.clusters > 1:
            weight = jnp.concatenate([weight, self.cluster_weight[...].astype(weight.dtype)])
            bias = jnp.concatenate([bias, self.cluster_bias[...]])
        return jax.nn.log_softmax(self._scores(h_ND, 0, weight, bias), axis=-1)

    def _tail_log_probs(self, h_ND: jax.Array, i: int) -> jax.Array:
        """``[N, V_i]``: log softmax of tail i."""
        logits = self._scores(h_ND, i, self._table(i, output=True), getattr(self, f"bias_{i}")[...])
        return jax.nn.log_softmax(logits, axis=-1)

    def log_prob(self, hidden: jax.Array, targets: jax.Array) -> jax.Array:
        """``log p(targets)`` float32 ``[...]`` for hidden states ``[..., D]`` and ids ``[...]``."""
        shape = targets.shape
        h_ND, t_N = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
        count = h_ND.shape[0]
        size = min(self.chunk, count)
        chunks = -(-count // size)
        pad = chunks * size - count
        h = jnp.pad(h_ND, ((0, pad), (0, 0))).reshape(chunks, size, -1)
        t = jnp.pad(t_N, (0, pad)).reshape(chunks, size)
        graphdef, state = nnx.split(self)

        @jax.checkpoint  # the backward recomputes a chunk's logits: one chunk's [size, V_i] live
        def one_chunk(state, h_chunk, t_chunk):
            return nnx.merge(graphdef, state)._log_prob(h_chunk, t_chunk)

        out = jax.lax.map(lambda ht: one_chunk(state, *ht), (h, t))
        return out.reshape(-1)[:count].reshape(shape)

    def _log_prob(self, h_ND: jax.Array, t_N: jax.Array) -> jax.Array:
        head = self._head_log_probs(h_ND)
        shortlist = self.bounds[1]
        out = jnp.take_along_axis(head, jnp.clip(t_N, 0, shortlist - 1)[:, None], axis=1)[:, 0]
        for i in range(1, self.clusters):
            low, high = self.bounds[i], self.bounds[i + 1]
            tail = self._tail_log_probs(h_ND, i)
            word = jnp.take_along_axis(tail, jnp.clip(t_N - low, 0, high - low - 1)[:, None], 1)
            inside = (t_N >= low) & (t_N < high)
            out = jnp.where(inside, head[:, -i] + word[:, 0], out)
        return out

    def log_probs(self, hidden: jax.Array) -> jax.Array:
        """Every word's log-probability ``[..., V]`` (for sampling and analysis: V floats a
        position)."""
        h_ND = hidden.reshape(-1, hidden.shape[-1])
        head = self._head_log_probs(h_ND)
        parts = [head[:, : self.bounds[1]]]
        for i in range(1, self.clusters):
            parts.append(head[:, -i : head.shape[1] - i + 1] + self._tail_log_probs(h_ND, i))
        return jnp.concatenate(parts, axis=1).reshape(*hidden.shape[:-1], -1)
