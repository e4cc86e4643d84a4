"""Matplotlib views of the position schemes: bias against distance, attention maps, RoPE frequencies.

Every plot takes an optional ``ax``; without one it draws on a new ``matplotlib.figure.Figure`` (no
pyplot: nothing global changes and it works headless) and returns the Axes. The numbers come from the
library itself (``relpos_jax.positions`` and a model's parameters), so a plot shows what runs.

``position_bias`` is what a scheme adds to the attention logit of a query and a key ``d = q_pos −
k_pos`` steps back, per head, in logit units: terms inside the scaled dot product (txl, shaw,
deberta, rope) include the layer's scale, as the softmax sees them. Terms that involve content
(shaw, deberta, rope) use a query and key vector: seeded standard-normal ones unless given (the key
defaults to the query, so RoPE shows its long-term decay ``Σ|q_i|² cos(d·θ_i)``). ``none`` gives
zeros (nothing is added); ``sinusoid`` and ``learned`` raise ValueError: their effect depends on
absolute positions, not on distance.

Legend: N heads, H head dim, X distances, Q/K queries and keys, R table rows.
"""

from __future__ import annotations

import math
import pathlib
import zlib
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from relpos_jax import positions as P

Fill = Callable[[Any, str, tuple[int, ...]], np.ndarray]
Distances = Sequence[int] | np.ndarray
Scaling = Mapping[str, Any] | None

ROPE_SCALINGS: dict[str, dict[str, Any] | None] = {
    "default": None,
    "linear (PI) x4": {"rope_type": "linear", "factor": 4.0},
    "ntk x4": {"rope_type": "ntk", "factor": 4.0},
    "yarn x4": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 2048},
    "llama3 x4": {
        "rope_type": "llama3",
        "factor": 4.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 2048,
    },
}
YARN_SCALING = ROPE_SCALINGS["yarn x4"]


def _filler(seed: int) -> Fill:
    """``fill(value, name, shape)``: ``value`` as float64, or a standard-normal draw seeded by name."""

    def fill(value: Any, name: str, shape: tuple[int, ...]) -> np.ndarray:
        if value is not None:
            return np.asarray(value, np.float64)
        return np.random.default_rng([seed, zlib.crc32(name.encode())]).standard_normal(shape)

    return fill


def _vectors(fill: Fill, p: dict[str, Any], n: int, h: int) -> tuple[np.ndarray, np.ndarray]:
    """The query and key ``[N, H]`` of the content-dependent terms (the key defaults to the query)."""
    q_NH = fill(p.pop("query", None), "query", (n, h))
    key = p.pop("key", None)
    return q_NH, q_NH if key is None else fill(key, "key", q_NH.shape)


def _scale(p: dict[str, Any], head_dim: int, terms: int = 1) -> float:
    scale = p.pop("scale", None)
    return 1.0 / math.sqrt(head_dim * terms) if scale is None else scale


# Each scheme: (distances [X], fill, heads, head dim, params) -> [N, X]; it pops the params it uses.
def _alibi(d, fill: Fill, n: int, h: int, p: dict[str, Any]) -> np.ndarray:
    return -np.asarray(P.alibi_slopes(n), np.float64)[:, None] * np.abs(d)[None, :]


def _t5(d, fill: Fill, n: int, h: int, p: dict[str, Any]) -> np.ndarray:
    table_RN = fill(p.pop("table", None), "t5_table", (p.pop("num_buckets", 32), n))
    bidirectional, max_distance = p.pop("bidirectional", False), p.pop("max_distance", 128)
    rows = P.t5_bucket(
        d, bidirectional=bidirectional, num_buckets=len(table_RN), max_distance=max_distance
    )
    return table_RN[np.asarray(rows)].T


def _shaw(d, fill: Fill, n: int, h: int, p: dict[str, Any]) -> np.ndarray:
    table_RH = fill(p.pop("table", None), "shaw_table", (2 * p.pop("max_distance", 16) + 1, h))
    q_NH, _ = _vectors(fill, p, n, h)
    rows = np.asarray(P.shaw_index(d, (len(table_RH) - 1) // 2))
    return _scale(p, h) * q_NH @ table_RH[rows].T


def _deberta(d, fill: Fill, n: int, h: int, p: dict[str, Any]) -> np.ndarray:
    bucket_size, max_position = p.pop("bucket_size", 256), p.pop("max_position", 512)
    pos_key_RNH = fill(p.pop("pos_key", None), "deberta_pos_key", (2 * bucket_size, n, h))
    pos_query_RNH = fill(p.pop("pos_query", None), "deberta_pos_query", (2 * bucket_size, n, h))
    q_NH, k_NH = _vectors(fill, p, n, h)
    bucket = np.asarray(P.deberta_bucket(d, bucket_size, max_position))
    rows = np.clip(bucket + bucket_size, 0, 2 * bucket_size - 1)  # as deberta_index
    c2p = np.einsum("nh,xnh->nx", q_NH, pos_key_RNH[rows])
    p2c = np.einsum("nh,xnh->nx", k_NH, pos_query_RNH[rows])
    return _scale(p, h, terms=3) * (c2p + p2c)


def _txl(d, fill: Fill, n: int, h: int, p: dict[str, Any]) -> np.ndarray:
    """The paper's term (d): ``vᵀ W_R R_d``, R the sinusoid of ``min(d, clamp_len)``."""
    w_r_DNH = fill(p.pop("w_r", None), "txl_w_r", (p.pop("d_model", None) or n * h, n, h))
    v_NH = fill(p.pop("v", None), "txl_v", (n, h))
    clamp_len = p.pop("clamp_len", None)
    clamped = d if clamp_len is None else np.minimum(d, clamp_len)
    r_XD = np.asarray(P.sinusoid(clamped, w_r_DNH.shape[0]), np.float64)
    return _scale(p, h) * np.einsum("xd,dnh,nh->nx", r_XD, w_r_DNH, v_NH)


def _rope(d, fill: Fill, n: int, h: int, p: dict[str, Any]) -> np.ndarray:
    """``q`` rotated to position d against ``k`` at position 0 (which RoPE scales by the factor)."""
    scaling, fraction = p.pop("scaling", None), p.pop("partial_rotary_factor", None)
    inv_freq, factor = P.rope_inv_freq(
        h, p.pop("base", 10000.0), scaling, p.pop("seq_len", None), partial_rotary_factor=fraction
    )
    q_NH, k_NH = _vectors(fill, p, n, h)
    q_XNH = jnp.broadcast_to(jnp.asarray(q_NH, jnp.float32), (d.size, n, h))
    interleaved = p.pop("interleaved", False)
    q_rot = np.asarray(P.apply_rope(q_XNH, d, inv_freq, factor, interleaved=interleaved))
    return _scale(p, h) * factor * np.einsum("xnh,nh->nx", q_rot.astype(np.float64), k_NH)


_SCHEMES = dict(alibi=_alibi, t5=_t5, shaw=_shaw, deberta=_deberta, txl=_txl, rope=_rope)


def position_bias(
    position: str,
    distances: Distances,
    *,
    num_heads: int = 8,
    head_dim: int = 64,
    seed: int = 0,
    **scheme_params: Any,
) -> np.ndarray:
    """``[num_heads, len(distances)]`` logit term of each scheme at ``d = q_pos − k_pos``.

    Parameters a scheme learns (tables, ``w_r``, ``v``) and the query/key vectors default to seeded
    standard-normal draws; pass them (see ``position_bias_from_model``) to see a model's.
    Scheme keywords: t5 ``table, num_buckets, max_distance, bidirectional``; shaw ``table,
    max_distance, query``; deberta ``pos_key, pos_query, bucket_size, max_position, query, key``;
    txl ``w_r, v, d_model, clamp_len``; rope ``base, scaling, seq_len, partial_rotary_factor,
    interleaved, query, key``; all but alibi and t5 take ``scale`` (default ``1/√head_dim``, deberta
    ``1/√(3·head_dim)``).
    """
    d = np.asarray(distances, np.int32)
    if d.ndim != 1:
        raise ValueError(f"position_bias: distances.shape={d.shape} is invalid; pass a 1-D list")
    if position == "none":
        return np.zeros((num_heads, d.size))
    if position in ("sinusoid", "learned"):
        raise ValueError(
            f"position_bias: position={position!r} is absolute, so it adds no bias that depends "
            "on distance alone; use a relative scheme (" + ", ".join(_SCHEMES) + ")"
        )
    if position not in _SCHEMES:
        raise ValueError(
            f"position_bias: position={position!r} is invalid; use one of {[*_SCHEMES, 'none']}"
        )
    params = dict(scheme_params)
    bias = _SCHEMES[position](d, _filler(seed), num_heads, head_dim, params)
    if params:
        raise ValueError(
            f"position_bias: {sorted(params)} are not parameters of {position!r}; see the docstring"
        )
    return np.asarray(bias, np.float64)


def position_bias_from_model(
    model: Any, layer: int, distances: Distances, **scheme_params: Any
) -> np.ndarray:
    """``position_bias`` with the tables, projections and scale of ``model``'s layer ``layer``.

    T5's table is shared by all layers; txl's ``v`` is the model's unless ``untie_r``. Keywords
    override (e.g. ``query=`` for shaw, deberta and rope, whose terms depend on content).
    """
    cfg = model.config
    if not 0 <= layer < cfg.n_layers:
        raise ValueError(
            f"position_bias_from_model: layer={layer} is invalid; use 0…{cfg.n_layers - 1}"
        )
    attn = model.blocks[layer].attention
    params: dict[str, Any] = {"num_heads": cfg.n_heads, "head_dim": cfg.head_dim}
    if cfg.position in ("shaw", "deberta", "txl", "rope"):
        params["scale"] = attn.scale
    if cfg.position == "t5":
        params.update(table=model.t5_table[...], max_distance=cfg.t5_max_distance)
    elif cfg.position == "shaw":
        params["table"] = attn.table_k[...]
    elif cfg.position == "deberta":
        rel_RD = model.rel_norm(model.rel_embed[...])  # as the model's position context builds it
        params.update(
            pos_key=jnp.einsum("rd,dnh->rnh", rel_RD, attn.w_kv[...][:, 0]),
            pos_query=jnp.einsum("rd,dnh->rnh", rel_RD, attn.w_q[...]),
            bucket_size=cfg.deberta_bucket_size,
            max_position=cfg.deberta_max_position,
        )
    elif cfg.position == "txl":
        v = attn.v if hasattr(attn, "v") else model.v
        params.update(w_r=attn.w_r[...], v=v[...], clamp_len=cfg.clamp_len)
    elif cfg.position == "rope":
        params.update(
            base=cfg.rope_base,
            scaling=cfg.rope_scaling,
            seq_len=int(np.abs(np.asarray(distances)).max()) + 1,
            partial_rotary_factor=cfg.rope_fraction,
            interleaved=cfg.rope_interleaved,
        )
    params.update(scheme_params)
    return position_bias(cfg.position, distances, **params)


def attention_weights(
    model: Any, tokens: Any, mems: Any = None, layer: int = 0, head: int | None = 0, *, row: int = 0
) -> np.ndarray:
    """Attention probabilities ``[Q, K]`` (``[N, Q, K]`` for ``head=None``) of batch row ``row``.

    Keys are the layer's memory slots, then the segment; unwritten slots and future keys get 0.
    From ``TransformerLM.attention_probabilities`` (no dropout).
    """
    tokens = jnp.asarray(tokens, jnp.int32)
    tokens = tokens[None] if tokens.ndim == 1 else tokens
    weights = np.asarray(model.attention_probabilities(tokens, mems, layer=layer)[row])
    return weights if head is None else weights[head]


def _axes(ax: Axes | None, figsize: tuple[float, float] = (6.0, 4.0)) -> Axes:
    """``ax``, or the Axes of a new pyplot-free Figure."""
    return Figure(figsize=figsize, layout="constrained").add_subplot() if ax is None else ax


def plot_bias_vs_distance(
    bias_NX: Any, distances: Distances, *, title: str = "", ax: Axes | None = None
) -> Axes:
    """One line per head: the logit bias (``position_bias``) against distance ``q_pos − k_pos``."""
    bias_NX, d = np.atleast_2d(np.asarray(bias_NX)), np.asarray(distances)
    if bias_NX.shape[1] != d.size:
        raise ValueError(
            f"plot_bias_vs_distance: bias.shape={bias_NX.shape} is invalid; "
            f"expected [heads, {d.size}] for {d.size} distances"
        )
    ax = _axes(ax)
    order = np.argsort(d, kind="stable")
    for head, row in enumerate(bias_NX):
        ax.plot(d[order], row[order], label=f"head {head}")
    ax.set(xlabel="distance d = q_pos − k_pos", ylabel="logit bias", title=title)
    if len(bias_NX) <= 16:
        ax.legend(fontsize="small", ncols=1 + len(bias_NX) // 9)
    return ax


def plot_attention_map(
    weights_QK: Any, *, mem_len: int, title: str = "", colorbar: bool = True, ax: Axes | None = None
) -> Axes:
    """One head's ``[Q, K]`` weights; a dashed line at ``x = mem_len − 0.5`` ends the memory."""
    weights_QK = np.asarray(weights_QK)
    if weights_QK.ndim != 2 or not 0 <= mem_len <= weights_QK.shape[1]:
        raise ValueError(
            f"plot_attention_map: weights.shape={weights_QK.shape}, mem_len={mem_len} is invalid; "
            "pass one head's [queries, memory + segment keys] and 0 ≤ mem_len ≤ keys"
        )
    ax = _axes(ax)
    image = ax.imshow(weights_QK, vmin=0.0, aspect="auto", interpolation="nearest")
    if colorbar:
        ax.get_figure().colorbar(image, ax=ax, label="attention weight")
    if mem_len:
        ax.axvline(mem_len - 0.5, color="white", linestyle="--", linewidth=1.0)
    ax.set(xlabel=f"key (0–{mem_len - 1}: memory, then segment)" if mem_len else "key")
    ax.set(ylabel="query (segment position)", title=title)
    for axis in (ax.xaxis, ax.yaxis):
        axis.set_major_locator(MaxNLocator(integer=True))
    return ax


def plot_rope_wavelengths(
    head_dim: int,
    base: float = 10000.0,
    scalings: Mapping[str, Scaling] | None = None,
    *,
    seq_len: int | None = None,
    context_len: int | None = None,
    ax: Axes | None = None,
) -> Axes:
    """Wavelength ``2π/θ_i`` per frequency index, log scale, one line per scaling (``ROPE_SCALINGS``).

    ``seq_len`` drives the dynamic kinds; ``context_len`` adds a dotted line at that length.
    """
    ax = _axes(ax)
    for name, scaling in (ROPE_SCALINGS if scalings is None else scalings).items():
        inv_freq, _ = P.rope_inv_freq(head_dim, base, scaling, seq_len)
        ax.plot(2 * np.pi / np.asarray(inv_freq, np.float64), marker=".", label=name)
    if context_len:
        ax.axhline(context_len, color="gray", linestyle=":", label=f"context {context_len}")
    ax.set(xlabel="frequency index i", ylabel="wavelength 2π/θ_i (tokens)", yscale="log")
    ax.legend(fontsize="small")
    return ax


def yarn_ramp(head_dim: int, base: float = 10000.0, scaling: Scaling = None) -> np.ndarray:
    """γ per frequency (``[rotary_dim // 2]``): 1 keeps θ_i, 0 interpolates it to θ_i / factor.

    Read back from ``rope_inv_freq``: ``θ'_i / θ_i = (1 − γ_i)/factor + γ_i``, exact for yarn,
    llama3 and linear (all 0); clipped to [0, 1]. ``scaling`` defaults to ``YARN_SCALING``.
    """
    scaling = dict(YARN_SCALING if scaling is None else scaling)
    factor = scaling.get("factor") or (
        scaling["max_position_embeddings"] / scaling["original_max_position_embeddings"]
    )
    plain = {k: v for k, v in scaling.items() if k in ("rope_theta", "partial_rotary_factor")}
    scaled, _ = P.rope_inv_freq(head_dim, base, scaling)
    original, _ = P.rope_inv_freq(head_dim, base, plain or None)
    ratio = np.asarray(scaled, np.float64) / np.asarray(original, np.float64)
    if factor == 1:
        return np.ones_like(ratio)
    return np.clip((ratio - 1 / factor) / (1 - 1 / factor), 0.0, 1.0)


def plot_yarn_ramp(
    head_dim: int,
    base: float = 10000.0,
    scaling: Scaling = None,
    *,
    ax: Axes | None = None,
) -> Axes:
    """``yarn_ramp`` against the frequency index (high frequencies, kept, on the left)."""
    ax = _axes(ax)
    ax.plot(yarn_ramp(head_dim, base, scaling), marker=".")
    ax.set(xlabel="frequency index i", ylabel="γ (1: keep θ_i, 0: θ_i / factor)", title="YaRN ramp")
    ax.set_ylim(-0.05, 1.05)
    return ax


def save(fig: Figure | Axes, path: str | pathlib.Path, *, dpi: int = 150) -> pathlib.Path:
    """Write ``fig`` (or an Axes' figure) as a PNG with a tight bounding box; returns the path."""
    figure = fig.get_figure(root=True) if isinstance(fig, Axes) else fig
    path = pathlib.Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png", dpi=dpi, bbox_inches="tight")
    return path
