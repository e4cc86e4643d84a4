"""Context parallelism: one segment's queries, and the window's keys, split over the mesh's
``context`` axis; every scheme exact, with memory.

Inside the model the segment ``[B, T, …]`` and the memory ``[B, M, …]`` are split into contiguous
blocks over ``context`` (``sharding.batch_sharding``, ``memory_sharding``): embeddings, norms and
feed-forward layers act position by position on their block. Attention is the one place where
positions meet. ``attend`` runs the tiles of ``attention.tiled`` under ``jax.shard_map``, every
mesh axis manual: batch rows split over data and fsdp, the queries and keys over ``context``, and
the heads whole on each tensor device (the projections around it still split them). No collective
the compiler might add may sit inside a tile's skip branch, whose predicate differs from device to
device. Within that, as a ring:

* forward: device d holds its queries and a block of the window's keys and values
  ``[B, K/c, N, H]`` with their positions and validity. At step s it scores its queries against
  block j = (d − s) mod c, tile by tile (``tiled.forward``: out and log-sum-exp of that block),
  merges the result into its running softmax (``_merge``), and passes the block on with
  ``jax.lax.ppermute``; after c steps every query has seen every key;
* backward: the ring once more; each block carries its keys' gradients with it, every device adds
  its queries' share (``tiled.gradients``, exact per block given the whole softmax's out and
  log-sum-exp), and after c steps each block's gradients are home. Nothing but one's own block and
  the one in transit is held: the saved state of a layer is q, k, v of one's own positions and the
  output.

The queries and keys carry their global positions, so Transformer-XL's band of ``W_R·R`` rows,
Shaw's tables, T5/ALiBi/KERPLE/FIRE biases and RoPE's rotation are those of one device (tested to
1e-5 for every scheme). What is not split: the schemes' own context, e.g. Transformer-XL's
``W_R·R`` for every distance ``[K, N, H]`` per layer, is on every device.

Communication per layer and device: (c − 1)/c of the window's keys and values forward
(``2·B·K·N·H`` values in all, c transfers of one block), the same twice backward (keys and values,
then their gradients travelling with them) — what an all-gather and a reduce-scatter would move,
but in c steps, each of which an accelerator can overlap with a block's work, and without ever
holding the whole window (which an all-gather would keep on every device, for the backward too).

Causal balance (the zig-zag order): under the causal rule a query block late in the segment has
more keys to score than an early one, so with contiguous blocks the first device would idle for
most of a layer. The queries are therefore dealt in 2c chunks, device i taking chunks i and
2c − 1 − i (an early and a late one: the same work on every device), with query tiles no larger
than a chunk so that each tile skips the key tiles in its own future. Where 2c does not divide T
the blocks stay contiguous. Outputs return to segment order before the output projection.

Attention dropout draws each device's masks from the layer's key folded with the device's index
and the key block's: the same distribution as one device, not the same masks.

Legend: B batch, T queries, K = M + T keys, N heads, H head dim, c devices on the context axis.
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from relpos_jax.attention import tile, tiled

AXIS = "context"
BATCH = ("data", "fsdp")  # sharding.BATCH: the axes that split batch rows


def blocks() -> int:
    """Devices on the ``context`` axis of the mesh being traced under (``jax.set_mesh``); 1 with
    none."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or AXIS not in mesh.axis_names:
        return 1
    return mesh.shape[AXIS]


def splits(q_len: int, k_len: int) -> bool:
    """Whether attention runs in blocks: a ``context`` axis that divides the segment and the
    window. Training and evaluation check their lengths at start (``sharding.check_context``);
    what does not divide (generation's one-token steps) runs whole on every device."""
    devices = blocks()
    return devices > 1 and q_len % devices == 0 and k_len % devices == 0


def zigzag(length: int, devices: int) -> np.ndarray | None:
    """The query order that deals 2c chunks as (i, 2c − 1 − i) to device i, or None where 2c does
    not divide ``length`` (contiguous blocks)."""
    if length % (2 * devices):
        return None
    chunk = length // (2 * devices)
    order = [c for i in range(devices) for c in (i, 2 * devices - 1 - i)]
    return np.concatenate([np.arange(c * chunk, (c + 1) * chunk) for c in order])


def _query_tile(query_tile: int | None, chunk: int) -> int:
    """The largest query tile ≤ ``query_tile`` that divides ``chunk`` (tiles never straddle two
    chunks, whose positions are not contiguous)."""
    limit = chunk if query_tile is None else min(query_tile, chunk)
    return max(d for d in range(1, limit + 1) if chunk % d == 0)


def attend(
    q_BTNH: jax.Array,
    k_BKNH: jax.Array,
    v_BKNH: jax.Array,
    *,
    q_pos: jax.Array,
    k_pos: jax.Array,
    key_valid: jax.Array,
    params: Any,
    mask: jax.Array | None,
    dropout_key: jax.Array | None,
    key_tile: int | None,
    query_tile: int | None,
    **hooks: Any,
) -> jax.Array:
    """``tiled.attend`` over the ``context`` axis (``hooks``: its ``scale``, ``logit_term``,
    ``value_term``, ``max_distance`` and ``dropatt``): the output ``[B, T, N, H]`` of one device,
    each device computing its block of queries against the ring of key blocks."""
    devices, q_len, k_len = blocks(), q_BTNH.shape[1], k_BKNH.shape[1]
    if not splits(q_len, k_len):
        raise ValueError(
            f"context attention: a segment of {q_len} and a window of {k_len} positions do not "
            f"split into {devices} blocks; use lengths that mesh.context divides"
        )
    order = zigzag(q_len, devices)
    chunk = q_len // devices if order is None else q_len // (2 * devices)
    if order is not None:
        q_BTNH, q_pos = q_BTNH[:, order], q_pos[order]
        mask = None if mask is None else mask[order]
    rows = _query_tile(query_tile, chunk) if key_tile is not None else None
    mesh = jax.sharding.get_abstract_mesh()
    row_axes = tuple(a for a in BATCH if a in mesh.axis_names)
    split_rows = (
        bool(row_axes) and q_BTNH.shape[0] % math.prod(mesh.shape[a] for a in row_axes) == 0
    )
    batch = row_axes if split_rows else None  # else every device scores every row
    seq, rep = jax.P(batch, AXIS), jax.P()
    own = (*row_axes, AXIS) if split_rows else AXIS  # the axes whose devices hold other data

    def local(q, k, v, q_pos, k_pos, key_valid, mask, key, params):
        if key is not None:
            key = jax.random.fold_in(key, jax.lax.axis_index(own))
        cfg, (q, k, v, params, q_pos, k_pos, key_valid, _, key) = tiled.plan(
            q, k, v, params, q_pos, k_pos, key_valid, None, key, key_tile=key_tile or k.shape[1],
            query_tile=rows, **hooks,
        )  # fmt: skip
        masks = None if mask is None else _mask_blocks(cfg, mask, devices, q.shape[1])
        out = _ring(cfg, devices, q, k, v, params, q_pos, k_pos, key_valid, masks, key)
        return out[:, : q_len // devices]

    out = jax.shard_map(
        local,
        in_specs=(seq, seq, seq, jax.P(AXIS), jax.P(AXIS), jax.P(AXIS), jax.P(AXIS), rep, rep),
        out_specs=seq,
    )(q_BTNH, k_BKNH, v_BKNH, q_pos, k_pos, key_valid, mask, dropout_key, params)
    if order is not None:
        out = out[:, np.argsort(order)]
    return out


def _mask_blocks(cfg: tile.TileConfig, mask_IK: jax.Array, devices: int, rows: int) -> jax.Array:
    """A device's mask rows ``[I, K]`` as ``[I', c, J']``: block j's columns, each block and the
    rows padded like the tiles (padding masked)."""
    per_block = mask_IK.shape[1] // devices
    blocks_ = mask_IK.reshape(mask_IK.shape[0], devices, per_block)
    padded = cfg.num_tiles * cfg.tile
    return jnp.pad(blocks_, ((0, rows - mask_IK.shape[0]), (0, 0), (0, padded - per_block)))


def _rotate(tree: Any, devices: int) -> Any:
    """Every device's blocks to the next device of the ring (device d receives d − 1's)."""
    ring = [(d, (d + 1) % devices) for d in range(devices)]
    return jax.tree.map(lambda x: jax.lax.ppermute(x, AXIS, ring), tree)


def _block(masks, key, j):
    """Block j's mask columns and dropout key (the same in the forward and the backward)."""
    mask = None if masks is None else jax.lax.dynamic_index_in_dim(masks, j, 1, keepdims=False)
    return mask, (None if key is None else jax.random.fold_in(key, j))


def _merge(out_a, lse_a, out_b, lse_b):
    """Two softmaxes over disjoint key sets as one: weights ``exp(lse_x − lse)``."""
    lse = jnp.logaddexp(lse_a, lse_b)
    weight = lambda x: tile.rows_to_output(jnp.exp(x - lse))  # noqa: E731
    return out_a * weight(lse_a) + out_b * weight(lse_b), lse


def _ring_forward(cfg, devices, q, k, v, params, q_pos, k_pos, valid, masks, key):
    """Step s: this device's queries against key block j = (d − s) mod c, merged into the running
    softmax; then every key block moves one device on."""
    me = jax.lax.axis_index(AXIS)

    def step(carry, s):
        out, lse, block = carry
        j = (me - s) % devices
        mask_j, key_j = _block(masks, key, j)
        out_j, lse_j = tiled.forward(cfg, q, block[0], block[1], params, q_pos, *block[2:],
                                     mask_j, key_j)  # fmt: skip
        out, lse = _merge(out, lse, out_j, lse_j)
        return (out, lse, _rotate(block, devices)), None

    batch, rows, heads, head_dim = q.shape
    init = (
        jnp.zeros((batch, rows, heads, head_dim), jnp.float32),
        jnp.full((batch, heads, rows), tile.NEG, jnp.float32),
    )
    (out, lse, _), _ = jax.lax.scan(
        step, (*tile.vary(cfg, init), (k, v, k_pos, valid)), jnp.arange(devices)
    )
    return out.astype(q.dtype), lse


@functools.partial(jax.custom_vjp, nondiff_argnums=(0, 1))
def _ring(cfg, devices, q, k, v, params, q_pos, k_pos, valid, masks, key) -> jax.Array:
    return _ring_forward(cfg, devices, q, k, v, params, q_pos, k_pos, valid, masks, key)[0]


def _ring_fwd(cfg, devices, q, k, v, params, q_pos, k_pos, valid, masks, key):
    out, lse = _ring_forward(cfg, devices, q, k, v, params, q_pos, k_pos, valid, masks, key)
    return out, (q, k, v, params, q_pos, k_pos, valid, masks, key, out, lse)


def _ring_bwd(cfg, devices, residuals, d_out):
    """The ring again: each key block's gradients travel with it and are home after c steps; the
    queries' and the position parameters' gradients stay on the device (the latter summed over
    devices by ``pcast``'s transpose)."""
    q, k, v, params, q_pos, k_pos, valid, masks, key, out, lse = residuals
    me = jax.lax.axis_index(AXIS)

    def step(carry, s):
        dq, dparams, block = carry
        k_j, v_j, k_pos_j, valid_j, dk_j, dv_j = block
        j = (me - s) % devices
        mask_j, key_j = _block(masks, key, j)
        gq, gk, gv, gp = tiled.gradients(
            cfg, (q, k_j, v_j, params, q_pos, k_pos_j, valid_j, mask_j, key_j, out, lse), d_out
        )
        block = (k_j, v_j, k_pos_j, valid_j, dk_j + gk, dv_j + gv)
        return (dq + gq, jax.tree.map(jnp.add, dparams, gp), _rotate(block, devices)), None

    zeros = lambda x: jnp.zeros(x.shape, jnp.float32)  # noqa: E731
    init = tile.vary(cfg, (zeros(q), jax.tree.map(zeros, params), zeros(k), zeros(v)))
    carry = (init[0], init[1], (k, v, k_pos, valid, init[2], init[3]))
    (dq, dparams, block), _ = jax.lax.scan(step, carry, jnp.arange(devices))
    return tiled.as_inputs((dq, block[4], block[5], dparams), q, k, v, params)


_ring.defvjp(_ring_fwd, _ring_bwd)
