"""Context parallelism: one segment's queries, and the window's keys, split over the mesh's
``context`` axis; every scheme exact, with memory.

Inside the model the segment ``[B, T, …]`` and the memory ``[B, M, …]`` are split into contiguous
blocks over ``context`` (``sharding.batch_sharding``, ``memory_sharding``): embeddings, norms and
feed-forward layers act position by position on their block. Attention is the one place where
positions meet. ``attend`` runs ``tiled.attend`` under ``jax.shard_map`` over the ``context`` axis
alone (the other axes stay with the compiler, so data, fsdp and tensor compose with it):

1. each device holds a block of the window's keys and values ``[B, K/c, N, H]``, and
   ``jax.lax.all_gather`` gives every device the whole window (the backward pass: a
   reduce-scatter of their gradients, which JAX derives);
2. each device scores its own queries against every key, in tiles, with the online softmax; the
   queries carry their global positions (and the keys theirs), so Transformer-XL's band of ``W_R·R``
   rows, Shaw's tables, T5/ALiBi/KERPLE/FIRE biases and RoPE's rotation are those of one device.

All-gather rather than a ring of ``ppermute``: both move the same (c − 1)/c of the window's keys
and values into each device per layer; the ring overlaps each step's transfer with a tile's work
and holds two blocks instead of the window, which matters on accelerators with fast links and is
the kernel work's business (the tile contract is the same). Here the window's keys and values
(``2·B·K·N·H`` per layer, linear in K) are live on every device during a layer, while everything
of size T·K stays in tiles.

Causal balance (the zig-zag order): under the causal rule a query block late in the segment has
more keys to score than an early one, so with contiguous blocks the first device would idle for
most of a layer. The queries are therefore dealt in 2c chunks, device i taking chunks i and
2c − 1 − i (an early and a late one: the same work on every device), with query tiles no larger
than a chunk so that each tile skips the key tiles in its own future. Where 2c does not divide T
the blocks stay contiguous. Outputs return to segment order before the output projection.

Attention dropout draws each device's masks from the layer's key folded with the device's index:
the same distribution as one device, not the same masks.

Legend: B batch, T queries, K = M + T keys, N heads, H head dim, c devices on the context axis.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import jax
import numpy as np

AXIS = "context"


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
    attend_fn: Callable[..., jax.Array],
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
) -> jax.Array:
    """``attend_fn`` (``tiled.attend`` with the layer's scheme bound) over the ``context`` axis:
    the output ``[B, T, N, H]`` of one device, each device computing its block of queries."""
    devices = blocks()
    q_len, k_len = q_BTNH.shape[1], k_BKNH.shape[1]
    for name, length in (("segment", q_len), ("window", k_len)):
        if length % devices:
            raise ValueError(
                f"context attention: the {name} of {length} positions does not split into "
                f"{devices} blocks; use lengths that mesh.context divides"
            )
    order = zigzag(q_len, devices)
    chunk = q_len // devices if order is None else q_len // (2 * devices)
    if order is not None:
        q_BTNH, q_pos = q_BTNH[:, order], q_pos[order]
        mask = None if mask is None else mask[order]
    rows = _query_tile(query_tile, chunk) if key_tile is not None else None
    seq, rep = jax.P(None, AXIS), jax.P()

    def local(q, k, v, q_pos, mask, k_pos, key_valid, key, params):
        k, v = (jax.lax.all_gather(x, AXIS, axis=1, tiled=True) for x in (k, v))
        if key is not None:
            key = jax.random.fold_in(key, jax.lax.axis_index(AXIS))
        return attend_fn(
            q, k, v, q_pos=q_pos, k_pos=k_pos, key_valid=key_valid, params=params, mask=mask,
            dropout_key=key, key_tile=key_tile, query_tile=rows,
        )  # fmt: skip

    out = jax.shard_map(
        local,
        in_specs=(seq, seq, seq, jax.P(AXIS), jax.P(AXIS, None), rep, rep, rep, rep),
        out_specs=seq,
        axis_names={AXIS},
    )(q_BTNH, k_BKNH, v_BKNH, q_pos, mask, k_pos, key_valid, dropout_key, params)
    if order is not None:
        out = out[:, np.argsort(order)]
    return out
