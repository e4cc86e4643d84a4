"""Matplotlib views of the position schemes: bias against distance, attention maps, RoPE frequencies.

Every plot takes an optional ``ax``; without one it draws on a new ``matplotlib.figure.Figure`` (no
pyplot: nothing global changes and it works headless) and returns the Axes. The numbers come from the
model itself: no formula is written twice, so a plot shows what runs.

``position_bias`` is what a scheme adds to the attention logit of a query and a key ``d = q_pos −
k_pos`` steps back, per head, in logit units as the softmax sees them, computed by the model's own
attention code (``TransformerLM.position_logits``). Terms that involve content (txl, shaw, deberta,
rope) use a query and key vector: seeded standard-normal ones unless given (the key defaults to the
query, so RoPE shows its long-term decay ``Σ|q_i|² cos(d·θ_i)``). ``none`` gives zeros (nothing is
added); ``sinusoid`` and ``learned`` raise ValueError: their effect depends on absolute positions,
not on distance.

Legend: N heads, H head dim, Q/K queries and keys.
"""

from __future__ import annotations

import pathlib
import zlib
from collections.abc import Mapping, Sequence
from typing import Any

import jax.numpy as jnp
import numpy as np
from flax import nnx
from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from relpos_jax import positions as P
from relpos_jax.config import POSITIONS, RELATIVE_POSITIONS, ConfigError
from relpos_jax.model import TransformerLM

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


def _vector(value: Any, name: str, seed: int, shape: tuple[int, ...]) -> np.ndarray:
    """``value`` as float32 ``[N, H]``, or a standard-normal draw seeded by ``seed`` and ``name``."""
    if value is None:
        value = np.random.default_rng([seed, zlib.crc32(name.encode())]).standard_normal(shape)
    value = np.asarray(value, np.float32)
    if value.shape != shape:
        raise ValueError(f"position_bias: {name}.shape={value.shape} is invalid; pass {shape}")
    return value


def position_bias_from_model(
    model: Any,
    layer: int,
    distances: Distances,
    *,
    query: Any = None,
    key: Any = None,
    seed: int = 0,
) -> np.ndarray:
    """``[N, len(distances)]``: what layer ``layer``'s scheme adds to the logit of a query and a key
    ``d = q_pos − k_pos ≥ 0`` steps back, computed by the model's own attention code
    (``TransformerLM.position_logits``): every logit term beyond the plain content product
    ``q·k/√H`` (RoPE: the whole product, which its rotation makes depend on d). Terms that involve
    content (txl, shaw, deberta, rope) use ``query`` and ``key`` ``[N, H]``, seeded standard-normal
    draws unless given (the key defaults to the query: RoPE then shows its long-term decay);
    Transformer-XL's global position term ``vᵀ W_R R_d`` alone is ``query=0, key=0``."""
    cfg = model.config
    d = np.asarray(distances)
    if d.ndim != 1 or not d.size or not np.issubdtype(d.dtype, np.integer) or d.min() < 0:
        raise ValueError(
            f"position_bias: distances={distances!r} is invalid; pass a 1-D list of ints ≥ 0 "
            "(a causal model never attends to keys ahead of the query)"
        )
    if not cfg.relative:
        raise ValueError(
            f"position_bias: position={cfg.position!r} is absolute, so it adds no bias that "
            f"depends on distance alone; use a relative scheme ({', '.join(RELATIVE_POSITIONS)})"
        )
    shape = (cfg.n_heads, cfg.head_dim)
    q_NH = _vector(query, "query", seed, shape)
    k_NH = q_NH if key is None else _vector(key, "key", seed, shape)
    by_distance = model.position_logits(layer, q_NH, k_NH, int(d.max()))
    return np.asarray(by_distance, np.float64)[:, d]


def position_bias(
    position: str,
    distances: Distances,
    *,
    num_heads: int = 8,
    head_dim: int = 64,
    seed: int = 0,
    query: Any = None,
    key: Any = None,
    **model_fields: Any,
) -> np.ndarray:
    """``position_bias_from_model`` of a one-layer model of scheme ``position`` whose parameters are
    seeded standard-normal draws (``init_std`` 1, unless given): the shape of each scheme's term
    before training. ``model_fields`` are other ``config.model`` fields (``clamp_len``,
    ``rope_scaling``, ``rope_base``, a scheme's settings such as ``t5={"max_distance": 64}`` …)."""
    if position not in POSITIONS:
        raise ValueError(f"position_bias: position={position!r} is invalid; use one of {POSITIONS}")
    fields = dict(init_std=1.0, **model_fields)
    config = dict(position=position, n_layers=1, n_heads=num_heads, d_model=num_heads * head_dim)
    try:
        model = TransformerLM({**config, "mem_len": 0, **fields}, rngs=nnx.Rngs(seed))
    except ConfigError as error:
        raise ValueError(f"position_bias: {error}") from None
    return position_bias_from_model(model, 0, distances, query=query, key=key, seed=seed)


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
