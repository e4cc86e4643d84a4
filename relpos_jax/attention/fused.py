"""The model's attention through the Pallas kernels (``attention.kernel``): a scheme's hooks as
tables by distance, and which path a call takes (``model.attention_impl``).

Every scheme whose terms depend on the distance alone is a set of tables by distance, built once
per layer and call (linear in K) from the hooks the dense and tiled paths use:

* the band hooks (``band_query``, ``band_rows``: Transformer-XL's ``(q + v)·W_R·R``) give the
  query side ``a`` and the logit rows;
* ``distance_tables`` gives what those do not (Shaw's key and value tables);
* a relative scheme's ``bias`` (T5, ALiBi, KERPLE), evaluated for one query against the window,
  gives the bias by distance; a term that depends on the query's position too (FIRE's bias) comes
  from ``distance_tables`` as a ``kernel.TileTerm`` the kernels evaluate in each tile, with a row of
  the scheme's parameters per head;
* ``content_query`` (txl's ``q + u``) and ``rotate`` (RoPE, before any path) act on q and k.

DeBERTa (``Scheme.fused = False``), an explicit ``mask``, a segment split over the ``context``
axis, and a chip the compiled kernels do not run on (TPU v4: ``kernel.unavailable``) run the tiled
path instead. ``auto`` takes the kernels on a TPU where they fit its VMEM, on a GPU only where
one of its kind measured them faster (``kernel.faster``), and elsewhere (and on a CPU) the dense
path up to ``DENSE_KEYS`` keys, the tiled one beyond (where its memory, linear in K,
matters and its time is no worse: ``docs/benchmarks/README.md``). ``kernel`` on a CPU runs the kernels in
Pallas' interpreter (exact and slow: for tests).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import sys
from typing import Any

import jax
import jax.numpy as jnp

from relpos_jax import schemes, sharding
from relpos_jax.attention import kernel
from relpos_jax.attention.kernel import faster, fit
from relpos_jax.errors import fail
from relpos_jax.ops import backend as ops_backend
from relpos_jax.schemes import Tile

DENSE_KEYS = 4096  # auto on a CPU: dense up to this window, tiled beyond
INTERPRET_BACKEND = "triton"  # which kernel variant a CPU interprets


def block(cfg: Any) -> int | None:
    """Queries and keys per kernel block: ``model.kernel_block``, or None for the kernels' default
    (on a GPU the largest whose kernels fit its shared memory: ``kernel.fit``; on a TPU 128)."""
    return cfg.kernel_block or None


def fusable(cfg: Any) -> bool:
    """Whether the kernels can run this model's attention (scheme and sizes)."""
    return schemes.get(cfg.position).fused and kernel.supports(cfg.head_dim, block(cfg) or 16)


def check(cfg: Any) -> None:
    """Refuse ``attention_impl="kernel"`` with sizes the kernels cannot take, in one line (a scheme
    they do not run falls back to the tiled path instead, as ``auto`` does for both)."""
    if cfg.attention_impl == "kernel" and schemes.get(cfg.position).fused and not fusable(cfg):
        fail(
            "model.attention_impl", "kernel",
            f"the kernels take a head dim and model.kernel_block that are powers of two ≥ 16 (head "
            f"dim {cfg.head_dim}, block {block(cfg) or 'default'}); change model.n_heads or "
            "model.d_head, or use tiled",
        )  # fmt: skip
    if cfg.attention_impl in ("kernel", "auto") and kernel.backend_of() == "mosaic":
        if (block(cfg) or 128) % 128:
            fail(
                "model.kernel_block", cfg.kernel_block,
                "a TPU's kernel blocks are multiples of 128 lanes; set 128, or 0 (the default)",
            )  # fmt: skip


def path(cfg: Any, q_len: int, k_len: int, mask: Any, split: bool) -> str:
    """``dense``, ``tiled`` or ``kernel``: what ``model.attention_impl`` means for this call."""
    impl = cfg.attention_impl
    if impl in ("dense", "tiled"):
        return impl
    if kernel.backend_of() is not None and (why := kernel.unavailable()):
        if impl == "kernel":
            fail("model.attention_impl", impl, f"{why}; use tiled (or auto, which takes it there)")
        _say_tiled(why)
        return "tiled"
    if mask is None and not split and fusable(cfg):
        backend = kernel.backend_of()
        if impl == "kernel":
            return "kernel"
        if backend == "mosaic":
            if why := _beyond_vmem(cfg, q_len, k_len):
                _say_tiled(why)
                return "tiled"
            return "kernel"
        if backend == "triton" and faster.measured_faster(
            ops_backend.device_kind(), cfg.position, q_len
        ):
            return "kernel"
    if impl == "kernel" or split or k_len > DENSE_KEYS:
        return "tiled"
    return "dense"


def _beyond_vmem(cfg: Any, q_len: int, k_len: int) -> str | None:
    """Why the Mosaic kernels would not fit the TPU's VMEM with this window (None: they would, by
    ``kernel.fit``'s bound; the scheme's tables counted as its hooks give them, at most a band and a
    value table)."""
    capacity = ops_backend.tpu_vmem_bytes()
    scheme = schemes.get(cfg.position)
    terms = fit.terms_of(schemes.overrides(scheme, "band_rows") or schemes.overrides(scheme, "distance_tables"),
                         schemes.overrides(scheme, "distance_tables"), schemes.overrides(scheme, "bias"), False)  # fmt: skip
    size = jnp.dtype(cfg.dtype).itemsize
    need = fit.mosaic_vmem_bytes(terms, q_len, k_len, cfg.head_dim, size)
    if capacity is None or fit.fits_vmem(terms, q_len, k_len, cfg.head_dim, size, capacity):
        return None
    return (
        f"the kernels would hold a window of {k_len:,} keys in VMEM ({need / 2**20:.0f} MiB, more "
        f"than the {capacity * 3 // 4 / 2**20:.0f} MiB they may take of the chip's)"
    )


@functools.cache  # once a process
def _say_tiled(why: str) -> None:
    if jax.process_index() == 0:
        print(
            f"warning: model.attention_impl=auto takes the tiled attention: {why}", file=sys.stderr
        )


def tables(attention: Any, q_BTNH: jax.Array, ctx: Any, context: Any) -> dict[str, Any]:
    """The kernel's inputs beyond k and v: the content query ``q`` and the tables by distance
    ``0 … K − 1`` (``kernel.Terms``' ``a``, ``logit_rows``, ``bias_rows``, ``value_rows``), or a
    term evaluated in each tile (``tile``, ``tile_rows``)."""
    scheme, scale = attention.scheme, attention.scale
    count = ctx.k_pos.shape[0]
    out = {"q": scheme.content_query(attention.position, q_BTNH, context)}
    if schemes.overrides(
        scheme, "band_rows"
    ):  # rows for distances count − 1 down: ascending, heads first
        rows = scheme.band_rows(attention.position, context, count - 1, count)
        out["a"] = scheme.band_query(attention.position, q_BTNH, context) * jnp.asarray(
            scale, q_BTNH.dtype
        )
        out["logit_rows"] = jnp.transpose(rows[::-1], (1, 0, 2))
    extra = scheme.distance_tables(attention, context, count)
    if "key_rows" in extra:
        out["a"] = q_BTNH * jnp.asarray(scale, q_BTNH.dtype)
        out["logit_rows"] = extra["key_rows"]
    if "value_rows" in extra:
        out["value_rows"] = extra["value_rows"]
    if "tile" in extra:  # not a table: evaluated in each tile (FIRE)
        out["tile_rows"], out["tile"] = extra["tile_rows"], extra["tile"]
    elif schemes.overrides(
        scheme, "bias"
    ):  # the last position against the window: distances K − 1 … 0
        bias = scheme.bias(
            attention.position, Tile(ctx.k_pos[-1:], ctx.k_pos, count - 1, 0), context
        )
        out["bias_rows"] = jnp.broadcast_to(bias, (attention.config.n_heads, 1, count))[:, 0, ::-1]
    return out


def _check_shared_memory(cfg: Any, terms: dict) -> None:
    """Refuse, in one line, a ``model.kernel_block`` whose kernels need more shared memory than the
    target GPU has a block (the default block always fits: ``kernel.fit.block``)."""
    if kernel.backend_of() != "triton" or not cfg.kernel_block:
        return
    key = fit.terms_of("logit_rows" in terms, "value_rows" in terms, "bias_rows" in terms,
                       "tile_rows" in terms)  # fmt: skip
    dtype = terms["q"].dtype
    if over := fit.oversized(key, cfg.kernel_block, cfg.head_dim, dtype.itemsize):
        capacity, fitting = over
        fail(
            "model.kernel_block", cfg.kernel_block,
            f"its kernels need more shared memory than this GPU's {capacity:,} B a block (head dim "
            f"{cfg.head_dim}, {dtype}); set {fitting}, or 0 (the default: the largest that fits)",
        )  # fmt: skip


def seed(key: jax.Array) -> jax.Array:
    """The dropout hash's int32 seed from a layer's key."""
    return jax.lax.bitcast_convert_type(jax.random.bits(key, (), jnp.uint32), jnp.int32)


def attend(attention: Any, q, k_BKNH, v_BKNH, ctx: Any, context: Any, rate: float, key):
    """Attention output ``[B, T, N, H]`` of one layer through the kernels; under a mesh, each
    device runs them on its batch rows and heads (``_per_device``)."""
    terms = tables(attention, q, ctx, context)
    _check_shared_memory(attention.config, terms)
    tile = terms.pop("tile", None)  # static: what the kernels evaluate in each tile
    valid = ctx.key_valid if ctx.key_valid is not None else jnp.ones(k_BKNH.shape[1], bool)
    backend = kernel.backend_of()
    options = dict(
        scale=attention.scale, max_distance=attention.max_distance(ctx), dropatt=rate,
        block=block(attention.config), backend=backend or INTERPRET_BACKEND,
        interpret=backend is None, tile=tile,
    )  # fmt: skip
    arrays = dict(terms, k=k_BKNH, v=v_BKNH, key_valid=valid)
    if rate:
        arrays["seed"] = seed(key)
    return _per_device(arrays, options)


def _kernel(arrays: dict, options: dict) -> jax.Array:
    """``kernel.attend`` of the arrays by name (q, k, v, key_valid, the seed, the terms)."""
    arrays, options = dict(arrays), dict(options)
    terms = {name: arrays.pop(name) for name in TERMS if name in arrays}
    q, k, v = arrays.pop("q"), arrays.pop("k"), arrays.pop("v")
    terms = kernel.Terms(**terms, tile=options.pop("tile"))
    return kernel.attend(q, k, v, terms, **arrays, **options)


TERMS = tuple(f.name for f in dataclasses.fields(kernel.Terms) if f.name != "tile")  # its arrays


def _per_device(arrays: dict, options: dict) -> jax.Array:
    """``kernel.attend`` on each device's share: batch rows split over the mesh's batch axes and
    heads over ``tensor`` where they divide (a Pallas call is opaque to XLA's partitioner); the
    dropout seed folded with the device's index."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty or mesh.size == 1:
        return _kernel(arrays, options)
    batch, heads = arrays["q"].shape[0], arrays["q"].shape[2]
    rows = tuple(a for a in sharding.BATCH if a in mesh.axis_names)
    rows = rows if rows and batch % math.prod(mesh.shape[a] for a in rows) == 0 else None
    split = "tensor" if "tensor" in mesh.axis_names and heads % mesh.shape["tensor"] == 0 else None

    def spec(name: str, x) -> jax.P:
        if name in ("q", "a", "k", "v"):
            return jax.P(rows, None, split, None)
        if name in TERMS[1:] and x.shape[0] == heads:
            return jax.P(split)
        return jax.P()

    def local(arrays):
        if "seed" in arrays:  # other draws on other devices
            index = jax.lax.axis_index(tuple(mesh.axis_names))
            arrays = dict(arrays, seed=arrays["seed"] + index * jnp.int32(0x3C6EF372 % 2**31))
        return _kernel(arrays, options)

    specs = {name: spec(name, x) for name, x in arrays.items()}
    # check_vma off: a Pallas call's outputs carry no varying-axes type; the transpose then sums
    # the cotangents of what every device shares (the tables, over the batch axes)
    return jax.shard_map(local, in_specs=(specs,), out_specs=spec("q", None), check_vma=False)(
        arrays
    )
