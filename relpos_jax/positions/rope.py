"""Rotary position embeddings (Su et al. 2021, arXiv 2104.09864) and their length extensions.

A query or key at position m is rotated pairwise by angles ``m·θ_i``; the dot product of two rotated
vectors then depends on ``m − n`` only. ``rope_inv_freq`` returns ``(θ [rotary_dim/2],
attention_factor)`` for the extension methods, in HuggingFace's ``rope_scaling`` vocabulary so that a
dict pasted from a model config works as is:

=========  ====================================================================================
rope_type  inverse frequencies (``θ_i = base^(−2i/d)`` unless stated)
=========  ====================================================================================
default    plain RoPE
linear     position interpolation (Chen et al. 2023, arXiv 2306.15595): ``θ / factor``
ntk        NTK-aware base (bloc97 2023): ``base · factor^(d/(d−2))``
dynamic    dynamic NTK: ``base · (factor·L/L₀ − (factor − 1))^(d/(d−2))``, L = max(seq_len, L₀)
yarn       YaRN (Peng et al. 2023, arXiv 2309.00071): interpolate low frequencies, keep high
           ones, ramp linearly in the dimension index between the ``beta_fast``/``beta_slow``
           rotation counts (as the released code does, not the paper's equation), and scale
           cos/sin by ``0.1·ln(factor) + 1`` (or the ``mscale``/``mscale_all_dim`` ratio)
llama3     Llama 3.1: divide low frequencies by ``factor``, keep high ones, smooth in between
longrope   LongRoPE (Ding et al. 2024): per-dimension ``short_factor`` / ``long_factor``, the long
           set once ``seq_len`` exceeds ``original_max_position_embeddings``
=========  ====================================================================================

``L₀`` is ``original_max_position_embeddings`` (for ``dynamic`` it is what HuggingFace reads from
``config.max_position_embeddings``). The attention factor multiplies cos and sin, so logits scale by
its square. For dynamic kinds rotate keys *before* caching them (HuggingFace issue #25104).

Legend: T time, N heads, H head dim, R rotary dim (``2·len(inv_freq)`` ≤ H).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp

from relpos_jax.positions import _checks

ROPE_TYPES = ("default", "linear", "ntk", "dynamic", "yarn", "llama3", "longrope")
_REQUIRED = {
    "default": (),
    "linear": ("factor",),
    "ntk": ("factor",),
    "dynamic": ("factor", "original_max_position_embeddings"),
    "yarn": ("original_max_position_embeddings",),
    "llama3": ("factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"),
    "longrope": ("short_factor", "long_factor", "original_max_position_embeddings"),
}
_KNOWN_KEYS = frozenset(
    {
        "rope_type",
        "type",
        "rope_theta",
        "partial_rotary_factor",
        "factor",
        "max_position_embeddings",
        "original_max_position_embeddings",
        "attention_factor",
        "beta_fast",
        "beta_slow",
        "mscale",
        "mscale_all_dim",
        "truncate",
        "low_freq_factor",
        "high_freq_factor",
        "short_factor",
        "long_factor",
    }
)


_POSITIVE = (
    "original_max_position_embeddings",
    "max_position_embeddings",
    "attention_factor",
    "beta_fast",
    "beta_slow",
    "low_freq_factor",
    "high_freq_factor",
)


def _validated(scaling: Mapping[str, Any] | None) -> tuple[str, dict[str, Any]]:
    if scaling is None:
        return "default", {}
    if not isinstance(scaling, Mapping):
        _checks.fail(
            "rope_inv_freq",
            "scaling",
            scaling,
            "pass None or a dict like {'rope_type': 'yarn', ...}",
        )
    params = dict(scaling)
    unknown = sorted(set(params) - _KNOWN_KEYS)
    if unknown:
        _checks.fail(
            "rope_inv_freq", "scaling", unknown[0], f"known keys are {sorted(_KNOWN_KEYS)}"
        )
    kind = params.get("rope_type", params.get("type", "default"))
    if kind not in ROPE_TYPES:
        _checks.fail("rope_inv_freq", "scaling['rope_type']", kind, f"use one of {ROPE_TYPES}")
    if kind in ("yarn", "longrope") and params.get("factor") is None:
        if "max_position_embeddings" not in params:
            _checks.fail(
                "rope_inv_freq",
                f"scaling (rope_type {kind})",
                "no 'factor'",
                "add 'factor' (or 'max_position_embeddings' to derive it)",
            )
    for key in _REQUIRED[kind]:
        if params.get(key) is None:
            _checks.fail(
                "rope_inv_freq", f"scaling['{key}']", None, f"rope_type '{kind}' needs '{key}'"
            )
    if kind != "default" and params.get("factor") is not None:
        _checks.positive_float("rope_inv_freq", "scaling['factor']", params["factor"])
    for key in _POSITIVE:
        if params.get(key) is not None:
            _checks.positive_float("rope_inv_freq", f"scaling['{key}']", params[key])
    if kind == "llama3" and not params["high_freq_factor"] > params["low_freq_factor"]:
        _checks.fail(
            "rope_inv_freq",
            "scaling['high_freq_factor']",
            params["high_freq_factor"],
            f"it must exceed low_freq_factor={params['low_freq_factor']}",
        )
    return kind, params


def _factor(params: dict[str, Any]) -> float:
    if params.get("factor") is not None:
        return float(params["factor"])
    return params["max_position_embeddings"] / params["original_max_position_embeddings"]


def _default_inv_freq(dim: int, base: float) -> jax.Array:
    return 1.0 / (base ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim))


def _yarn(dim: int, base: float, p: dict[str, Any]) -> tuple[jax.Array, float]:
    factor = _factor(p)
    original = p["original_max_position_embeddings"]

    def get_mscale(scale: float, mscale: float = 1.0) -> float:
        return 1.0 if scale <= 1 else 0.1 * mscale * math.log(scale) + 1.0

    attention_factor = p.get("attention_factor")
    if attention_factor is None:
        if p.get("mscale") and p.get("mscale_all_dim"):
            attention_factor = get_mscale(factor, p["mscale"]) / get_mscale(
                factor, p["mscale_all_dim"]
            )
        else:
            attention_factor = get_mscale(factor)

    def correction_dim(
        rotations: float,
    ) -> float:  # the dimension that turns `rotations` times in L₀
        return dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(base))

    low, high = correction_dim(p.get("beta_fast") or 32), correction_dim(p.get("beta_slow") or 1)
    if p.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001  # the released code's guard against a zero-width ramp
    ramp = jnp.clip((jnp.arange(dim // 2, dtype=jnp.float32) - low) / (high - low), 0, 1)
    extrapolation = 1 - ramp  # 1: keep the original frequency (fast dims), 0: interpolate
    pos_freqs = base ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim)
    inv_freq = (1.0 / (factor * pos_freqs)) * (1 - extrapolation) + (
        1.0 / pos_freqs
    ) * extrapolation
    return inv_freq, float(attention_factor)


def _llama3(dim: int, base: float, p: dict[str, Any]) -> jax.Array:
    inv_freq = _default_inv_freq(dim, base)
    factor, low, high = p["factor"], p["low_freq_factor"], p["high_freq_factor"]
    original = p["original_max_position_embeddings"]
    wavelen = 2 * math.pi / inv_freq
    scaled = jnp.where(wavelen > original / low, inv_freq / factor, inv_freq)
    smooth = (original / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = (wavelen >= original / high) & (wavelen <= original / low)
    return jnp.where(medium, smoothed, scaled)


def _longrope(dim: int, base: float, p: dict[str, Any], seq_len: Any) -> tuple[jax.Array, float]:
    original = p["original_max_position_embeddings"]
    for key in ("short_factor", "long_factor"):
        if len(p[key]) != dim // 2:
            _checks.fail(
                "rope_inv_freq",
                f"scaling['{key}']",
                f"length {len(p[key])}",
                f"give one factor per rotary pair ({dim // 2})",
            )
    factor = _factor(p)
    attention_factor = p.get("attention_factor")
    if attention_factor is None:
        attention_factor = (
            1.0 if factor <= 1 else math.sqrt(1 + math.log(factor) / math.log(original))
        )
    short = jnp.asarray(p["short_factor"], jnp.float32)
    long = jnp.asarray(p["long_factor"], jnp.float32)
    ext = short if seq_len is None else jnp.where(jnp.asarray(seq_len) > original, long, short)
    shape = jnp.arange(0, dim, 2, dtype=jnp.float32) / dim
    return 1.0 / (ext * base**shape), float(attention_factor)


def rope_inv_freq(
    head_dim: int,
    base: float = 10000.0,
    scaling: Mapping[str, Any] | None = None,
    seq_len: int | jax.Array | None = None,
    *,
    partial_rotary_factor: float | None = None,
) -> tuple[jax.Array, float]:
    """``(inv_freq [rotary_dim // 2], attention_factor)`` for RoPE and its extensions.

    ``seq_len`` (a Python int or a traced scalar) drives ``dynamic`` and ``longrope``. The rotary
    dimension is ``int(head_dim · partial_rotary_factor)`` (keyword or ``scaling`` key; default 1).
    """
    _checks.positive_int("rope_inv_freq", "head_dim", head_dim)
    kind, p = _validated(scaling)
    base = _checks.positive_float("rope_inv_freq", "base", p.get("rope_theta", base))
    fraction = partial_rotary_factor or p.get("partial_rotary_factor", 1.0)
    if not 0 < fraction <= 1:
        _checks.fail("rope_inv_freq", "partial_rotary_factor", fraction, "use a value in (0, 1]")
    dim = int(head_dim * fraction)
    if dim < 2 or dim % 2:
        _checks.fail(
            "rope_inv_freq",
            "head_dim",
            head_dim,
            f"the rotary dim head_dim·{fraction} = {dim} must be even and ≥ 2; use an even head_dim",
        )
    if kind == "default":
        return _default_inv_freq(dim, base), 1.0
    if kind == "linear":
        return _default_inv_freq(dim, base) / p["factor"], 1.0
    if kind == "ntk":
        if dim <= 2:
            _checks.fail(
                "rope_inv_freq", "head_dim", head_dim, "NTK scaling needs a rotary dim > 2"
            )
        return _default_inv_freq(dim, base * p["factor"] ** (dim / (dim - 2))), 1.0
    if kind == "dynamic":
        factor, original = p["factor"], p["original_max_position_embeddings"]
        length = original if seq_len is None else seq_len
        if isinstance(length, int | float):
            length = max(length, original)
            new_base = base * ((factor * length / original) - (factor - 1)) ** (dim / (dim - 2))
        else:
            length = jnp.maximum(jnp.asarray(length, jnp.float32), original)
            new_base = base * ((factor * length / original) - (factor - 1)) ** (dim / (dim - 2))
        return 1.0 / (new_base ** (jnp.arange(0, dim, 2, dtype=jnp.float32) / dim)), 1.0
    if kind == "yarn":
        return _yarn(dim, base, p)
    if kind == "llama3":
        return _llama3(dim, base, p), 1.0
    return _longrope(dim, base, p, seq_len)


def apply_rope(
    x: jax.Array,
    positions: jax.Array,
    inv_freq: jax.Array,
    attention_factor: float | jax.Array = 1.0,
    *,
    interleaved: bool = False,
) -> jax.Array:
    """Rotate ``x [..., T, N, H]`` by ``positions [..., T]``; dims past ``2·len(inv_freq)`` pass through.

    ``interleaved=False`` is the rotate-half layout (pairs ``(x_i, x_{i+R/2})``, GPT-NeoX, Llama,
    HuggingFace); ``interleaved=True`` pairs neighbours ``(x_{2i}, x_{2i+1})`` (the paper, GPT-J).
    """
    _checks.ndim("apply_rope", "x", x, tuple(range(3, 9)), "[..., T, heads, head_dim]")
    compute = jnp.promote_types(x.dtype, jnp.float32)  # bf16 in, float32 math; float64 stays
    cos, sin = rope_cos_sin(positions, inv_freq, attention_factor, compute)
    return rotate(x, cos, sin, interleaved=interleaved)


def rope_cos_sin(
    positions: jax.Array,
    inv_freq: jax.Array,
    attention_factor: float | jax.Array = 1.0,
    dtype=jnp.float32,
) -> tuple[jax.Array, jax.Array]:
    """``(cos, sin)`` of the angles ``positions ⊗ inv_freq``, ``[..., T, R/2]``, times the attention
    factor: what ``rotate`` needs, computed once and shared by every layer's queries and keys."""
    angles = jnp.asarray(positions, dtype)[..., None] * inv_freq.astype(dtype)
    return jnp.cos(angles) * attention_factor, jnp.sin(angles) * attention_factor


def rotate(x: jax.Array, cos: jax.Array, sin: jax.Array, *, interleaved: bool = False) -> jax.Array:
    """``apply_rope`` from precomputed ``rope_cos_sin``: ``x [..., T, N, H]``, ``cos, sin [..., T, R/2]``."""
    _check_fits(cos, x.shape[-1])
    cos, sin = cos[..., None, :], sin[..., None, :]  # [..., T, 1, R/2]
    return _rotate_along(x, cos, sin, -1, interleaved)


def rotate_columns(
    x: jax.Array, cos: jax.Array, sin: jax.Array, *, interleaved: bool = False
) -> jax.Array:
    """``rotate`` for ``x [..., N, H, T]``, each position a column (keys laid out ``[B, N, H, K]``,
    as the content product reads them), with the same ``cos, sin [..., T, R/2]``: the pairs are
    rows of ``x``, so the rotation runs along whole rows and no transposition is needed."""
    _check_fits(cos, x.shape[-2])
    cos, sin = jnp.swapaxes(cos, -1, -2), jnp.swapaxes(sin, -1, -2)  # [..., R/2, T]
    cos, sin = cos[..., None, :, :], sin[..., None, :, :]  # [..., 1, R/2, T]
    return _rotate_along(x, cos, sin, -2, interleaved)


def _check_fits(cos: jax.Array, head_dim: int) -> None:
    half = cos.shape[-1]
    if 2 * half > head_dim:
        _checks.fail(
            "apply_rope",
            "inv_freq.shape",
            (half,),
            f"at most head_dim/2 = {head_dim // 2} frequencies fit this x",
        )


def _rotate_along(x, cos, sin, axis: int, interleaved: bool) -> jax.Array:
    """The rotation of the first R entries (R/2 pairs) along ``x``'s head axis ``axis`` (−1 or −2),
    by ``cos, sin`` already shaped to broadcast against the pairs' halves."""
    half = cos.shape[axis]
    compute = jnp.promote_types(x.dtype, cos.dtype)

    def along(array, part):  # array[..., part] or array[..., part, :]
        return array[(..., part) if axis == -1 else (..., part, slice(None))]

    rot, rest = along(x, slice(0, 2 * half)).astype(compute), along(x, slice(2 * half, None))
    if interleaved:
        a, b = along(rot, slice(0, None, 2)), along(rot, slice(1, None, 2))
        rotated = jnp.stack([a * cos - b * sin, b * cos + a * sin], axis=axis)
        rotated = rotated.reshape(rot.shape)
    else:
        a, b = along(rot, slice(0, half)), along(rot, slice(half, None))
        rotated = jnp.concatenate([a * cos - b * sin, b * cos + a * sin], axis=axis)
    return jnp.concatenate([rotated.astype(x.dtype), rest], axis=axis)
