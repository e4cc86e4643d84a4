"""FIRE (Li et al., ICLR 2024, "Functional Interpolation for Relative Positions Improves Long Context
Transformers"): a learned function of the distance, progressively interpolated by the query's
position,

    b(i, j) = f_θ( ψ(i − j) / ψ(max(L, i)) ),        ψ(x) = log(c·x + 1),

with ``f_θ`` an MLP from a scalar to one bias per head (one hidden layer of ``model.fire.hidden``
ReLU units, 32 as the paper), and ``c``
and the threshold ``L`` learned, per layer, added to the logits after scaling. ``i`` is the query's
position, which here counts from the oldest key it can see (the model's positions); so FIRE is not
translation invariant, and is tested against a float64 loop of this formula. Future keys (i < j),
which the mask removes anyway, are scored at distance 0, so that no NaN reaches the masked entries'
gradients.

The paper makes ``L`` a learnable threshold of the normaliser (§3.2, "thresholding the normalizer
for better short sequence modeling": queries before ``L`` share the normaliser ``ψ(L)``, so that
short contexts are not squeezed into a narrow range), and the PyTorch listing of its appendix
starts ``c`` at 0.1 (``model.fire.init_c``) and learns ``L`` as ``|L_multiplier · init_L|``: a multiplier starting at 1
times a constant ``init_L`` (512 there), so that under Adam ``L`` moves in proportion to its
size (learning ``L`` itself, it would move by about the learning rate a step: frozen). Here
``init_L`` is ``model.fire.threshold``, by default
(None) the training attention window: ``data.segment_len + model.mem_len``, the longest query
position + 1 a training step has (``config.training_window``; a model section built without its
config's data section takes base.py's segment length). So a training window's inputs span
``[0, 1)`` and a longer window at evaluation is interpolated into that range, the paper's intent;
512, above the 64–256-token windows of these configs, left the threshold unreached in training
(inputs up to ``ψ(W)/ψ(512)`` only) and every longer window's inputs partly unseen.

The MLP's first layer, weight and bias, starts uniform in (−1, 1): what ``torch.nn.Linear(1, 32)``
draws (bounds ``1/√fan_in``), as in the paper's listing and the reimplementations that follow it;
the output layer starts at N(0, init_std²) and zero. A hidden unit with ``b1 ≤ 0`` and
``w1 + b1 ≤ 0`` is dead on every input in ``[0, 1]`` (and gets no gradient): 3/8 of them in
expectation under this init, against 1/2 under the former ``w1 ~ N(0, 1)``, ``b1 = 0``.
"""

from __future__ import annotations

import dataclasses
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx
from ml_collections import config_dict

from relpos_jax.errors import at_least, fail
from relpos_jax.schemes.base import Scheme, Tile, normal_param, register

FIRST_LAYER_BOUND = 1.0  # w1, b1 ~ U(−1, 1): torch.nn.Linear(1, ·)'s 1/√fan_in


def threshold(cfg: Any) -> int:
    """``L`` at init: ``model.fire.threshold``, or (None) the training attention window."""
    if cfg.fire.threshold is not None:
        return cfg.fire.threshold
    from relpos_jax.config import training_window  # here: the config module imports the schemes

    return training_window(cfg)


def learned_threshold(own: Any) -> jax.Array:
    """``L = |L_multiplier · init_L|`` of a layer (``own``: its ``Parameters``), ``init_L`` its
    config's ``threshold``."""
    return jnp.abs(own.fire_L_multiplier[...] * threshold(own.config))


def _uniform(rngs: nnx.Rngs, shape: tuple[int, ...], bound: float) -> nnx.Param:
    return nnx.Param(jax.random.uniform(rngs.params(), shape, jnp.float32, -bound, bound))


@register
class Fire(Scheme):
    name = "fire"
    relative = False  # the normaliser depends on the query's own position
    must_match = ("hidden",)
    renamed: ClassVar[dict[str, str]] = {"fire_threshold": "threshold"}

    def config(self) -> ml_collections.ConfigDict:
        own = ml_collections.ConfigDict()
        own.hidden = 32  # the MLP's width
        own.init_c = 0.1  # ψ's scale c at init (the paper's listing)
        # the threshold L of ψ(max(L, i)) at init (learned after); None: the training window,
        # data.segment_len + model.mem_len (the longest query position + 1 of a training step)
        own.threshold = config_dict.placeholder(int)
        return own

    def check_settings(self, own: Any) -> None:
        at_least("model.fire.hidden", own.hidden, 1)
        if not own.init_c > 0:
            fail("model.fire.init_c", own.init_c, "use a positive scale such as 0.1")
        if own.threshold is not None:
            at_least("model.fire.threshold", own.threshold, 1)

    def window_fields(self, cfg: Any, window: int) -> dict[str, Any]:
        return {"threshold": window} if cfg.fire.threshold is None else {}

    def layer_params(self, cfg: Any, rngs: nnx.Rngs) -> dict[str, Any]:
        n, std, hidden = cfg.n_heads, cfg.init_std, cfg.fire.hidden
        return {
            "fire_w1": _uniform(rngs, (hidden,), FIRST_LAYER_BOUND),
            "fire_b1": _uniform(rngs, (hidden,), FIRST_LAYER_BOUND),
            "fire_w2": normal_param(rngs, (hidden, n), std, (None, "heads")),
            "fire_b2": nnx.Param(jnp.zeros((n,), jnp.float32)),
            "fire_c": nnx.Param(jnp.asarray(cfg.fire.init_c, jnp.float32)),
            "fire_L_multiplier": nnx.Param(jnp.asarray(1.0, jnp.float32)),
        }

    def context(self, model, q_pos, k_pos, deterministic) -> dict[str, Any]:
        # where the kernels count the queries from (float: every leaf of the context is a
        # parameter to the tiled path, which differentiates it, here to no effect)
        return {"first_query": q_pos[0].astype(jnp.float32)}

    def distance_tables(self, attention, context, count: int):
        """Not a table: the kernels evaluate the bias in each tile (``FireTile``) from a row of
        these parameters per head."""
        own = attention.position
        rows = pack(
            jnp.abs(own.fire_c[...]), learned_threshold(own), context["first_query"],
            own.fire_w1[...], own.fire_b1[...], own.fire_w2[...], own.fire_b2[...],
        )  # fmt: skip
        return {"tile_rows": rows, "tile": FireTile(own.config.fire.hidden)}

    def bias(self, own, tile: Tile, context) -> jax.Array:
        c, threshold = jnp.abs(own.fire_c[...]), learned_threshold(own)
        q_pos = tile.q_pos.astype(jnp.float32)
        distance = jnp.maximum(q_pos[:, None] - tile.k_pos[None, :].astype(jnp.float32), 0.0)
        normaliser = jnp.log1p(c * jnp.maximum(threshold, q_pos))  # ψ(max(L, i)) [I]
        x_IJ = jnp.log1p(c * distance) / normaliser[:, None]
        hidden = jax.nn.relu(x_IJ[..., None] * own.fire_w1[...] + own.fire_b1[...])
        bias_IJN = hidden @ own.fire_w2[...] + own.fire_b2[...]
        return jnp.moveaxis(bias_IJN, -1, 0)  # [N, I, J]


# ------------------------------------------------------------------ the kernels' term in a tile

WIDTH = 128  # lanes of a head's row (``TileTerm.WIDTH``)
C, L, FIRST, B2, HIDDEN_AT = 0, 1, 2, 3, 4  # the row: c, L, the first query's position, b2, …


def pack(c, threshold, first_query, w1, b1, w2_HN, b2_N) -> jax.Array:
    """``[N, 1, WIDTH]`` rows of the heads' parameters (``c`` and ``L`` already positive): ``c, L``,
    the first query's position, ``b2``, then the hidden units' ``w1``, ``b1`` and ``w2``."""
    heads, hidden = b2_N.shape[0], w1.shape[0]
    if HIDDEN_AT + 3 * hidden > WIDTH:
        raise ValueError(f"kernel FIRE: {hidden} hidden units do not fit a row of {WIDTH}")
    shared = jnp.stack([c, threshold, first_query]).astype(jnp.float32)
    rows = [
        jnp.broadcast_to(shared, (heads, 3)), b2_N[:, None].astype(jnp.float32),
        jnp.broadcast_to(w1.astype(jnp.float32), (heads, hidden)),
        jnp.broadcast_to(b1.astype(jnp.float32), (heads, hidden)), w2_HN.T.astype(jnp.float32),
    ]  # fmt: skip
    row = jnp.concatenate(rows, axis=1)
    return jnp.pad(row, ((0, 0), (0, WIDTH - row.shape[1])))[:, None, :]


def _at(ref, lane: int):
    """Lane ``lane`` of the row, ``[1, 1]`` (broadcasts over a tile)."""
    return ref[:, lane : lane + 1]


@dataclasses.dataclass(frozen=True)
class FireTile:
    """FIRE's bias inside a kernel tile (``attention.kernel``'s ``TileTerm``): ``b(i, j) =
    f(ψ(d)/ψ(max(L, i)))``, ``f(x) = Σ_h w2_h·relu(w1_h·x + b1_h) + b2`` (one head's output of the
    MLP), not a table by distance since the normaliser depends on the query, so each tile evaluates
    it, and its gradient, element by element from the head's row (``pack``); the packing's own vjp
    carries the row's gradient to the parameters. The hidden units are a loop in the kernel
    (``fori_loop``), not a copy of the body per unit: unrolled, Triton's compile time and register
    spills grow with the units."""

    hidden: int  # the MLP's hidden units

    def _inputs(self, spec, ref, delta, q_block):
        """``x = ψ(d)/ψ(max(L, i))`` ``[S, S]`` and what its gradient needs."""
        from relpos_jax.attention.kernel import common  # here: the kernels import the schemes

        c, threshold = _at(ref, C), _at(ref, L)
        shape = (spec.block, spec.block)
        query = q_block * spec.block + jax.lax.broadcasted_iota(jnp.int32, shape, 0)
        position = _at(ref, FIRST) + query.astype(jnp.float32)
        distance = jnp.maximum(common.distance(spec, delta), 0).astype(jnp.float32)
        reach = jnp.maximum(threshold, position)
        u, r = jnp.log(1.0 + c * distance), jnp.log(1.0 + c * reach)
        return u / r, (c, threshold, position, distance, reach, u, r)

    def _unit(self, ref, h):
        """Hidden unit ``h``'s ``(w1, b1, w2)``, each ``[1, 1]``: a traced ``h`` picks its lanes by
        a masked sum."""
        row = ref[...]
        lanes = jax.lax.broadcasted_iota(jnp.int32, row.shape, 1)

        def pick(k: int) -> jax.Array:
            where = lanes == HIDDEN_AT + k * self.hidden + h
            return jnp.sum(jnp.where(where, row, 0.0), 1, keepdims=True)

        return pick(0), pick(1), pick(2)

    def bias(self, spec, ref, delta, q_block) -> jax.Array:
        """FIRE's ``[S, S]`` bias of a tile at offset ``δ`` of query block ``q_block``."""
        x, _ = self._inputs(spec, ref, delta, q_block)

        def unit(h, out):
            w1, b1, w2 = self._unit(ref, h)
            return out + w2 * jnp.maximum(w1 * x + b1, 0.0)

        return jax.lax.fori_loop(0, self.hidden, unit, jnp.zeros_like(x) + _at(ref, B2))

    def gradient(self, spec, ref, delta, q_block, ds) -> jax.Array:
        """``[1, WIDTH]``: the gradient of the row from the tile's logit gradient ``ds``."""
        x, (c, threshold, position, distance, reach, u, r) = self._inputs(spec, ref, delta, q_block)
        lanes = jax.lax.broadcasted_iota(jnp.int32, (1, WIDTH), 1)
        total = lambda y: jnp.sum(y, axis=(0, 1), keepdims=True)  # noqa: E731
        out = jnp.where(lanes == B2, total(ds), 0.0)
        n = self.hidden

        def unit(h, carry):
            out, dx = carry
            w1, b1, w2 = self._unit(ref, h)
            z = w1 * x + b1
            g = jnp.where(z > 0, ds * w2, 0.0)
            for k, value in enumerate((total(g * x), total(g), total(ds * jnp.maximum(z, 0.0)))):
                out = out + jnp.where(lanes == HIDDEN_AT + k * n + h, value, 0.0)
            return out, dx + g * w1

        out, dx = jax.lax.fori_loop(0, n, unit, (out, jnp.zeros_like(x)))
        # x = u / r: u = ψ(d), r = ψ(max(L, i))
        dr = -dx * u / (r * r)
        d_c = dx * distance / ((1.0 + c * distance) * r) + dr * reach / (1.0 + c * reach)
        d_threshold = jnp.where(threshold > position, dr * c / (1.0 + c * reach), 0.0)
        out = out + jnp.where(lanes == C, total(d_c), 0.0)
        return out + jnp.where(lanes == L, total(d_threshold), 0.0)
