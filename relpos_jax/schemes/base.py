"""The plug-in contract of a position scheme, and the registry that names them.

A scheme is one module in this folder that defines a ``Scheme`` subclass and registers it. It
creates its parameters (shared by every layer, or per layer), derives a per-forward context from the
explicit positions of the attention window, and supplies only the hooks it needs:

====================  =========================================================================
hook                  what it gives, and who uses it
====================  =========================================================================
``embed``             absolute positions added to the token embeddings (sinusoid, learned)
``rotate``            a q/k transform from the positions (rope and its scalings, xpos)
``content_query``     the query of the content product ``q·k`` (txl: ``q + u``)
``score_term``        ``[B, N, I, J]`` added to ``q·k`` inside the scaled product (txl, shaw, deberta)
``bias``              ``[N, I, J]`` added after scaling (t5, alibi)
``value_term``        ``[B, I, N, H]`` added to the weighted values (shaw's value side)
``layer_context``     what a layer computes once before its tiles (txl: ``W_R·R``)
``band_query``        the query side ``a_i`` of a score term given as a band ``a_i · w_{i−j}``
                      (txl: ``q + v``)
``band_rows``         its rows ``w`` by distance (txl: ``W_R·R``): the tiled path scores each
                      distance once (``attention.band``); ``score_term`` gives the dense window's
``distance_tables``   a score or value term as tables by distance for the fused kernels
                      (``attention.kernel``), where the band and bias hooks do not give them
                      (shaw: its key and value tables), or a term the kernels evaluate in each
                      tile (fire: ``tile``, a ``kernel.TileTerm``, and its ``tile_rows``)
``fused``             whether the kernels can run the scheme (False: DeBERTa; the tiled path
                      runs it)
====================  =========================================================================

A scheme declares its own settings, ``model.<name>.<field>`` (``config``: a ConfigDict of defaults,
which ``configs/base.py`` adds to the model section; ``check_settings`` checks them, in one line,
for every scheme; ``validate`` checks the model values the named scheme needs), which
of them a checkpoint must match (``must_match``: they decide the parameters' shapes or meaning), and
the flat model fields they replaced (``renamed``: an old command line or dict is refused in one line
that names the new field; an old checkpoint's saved values are read under them). It reads them as
``cfg.<name>.<field>`` (``settings``).

A scheme may also declare ``floors``, the least value of some of its parameters (KERPLE's r1, r2 ≥
1e-2): ``apply_floors`` projects them there after every optimizer update (``train_step``), and the
forward reads them through ``floored``, whose gradient passes (a parameter at its floor still
learns). ``window_fields`` gives the settings whose default is the training window (FIRE's
threshold), set by ``Config`` where the data section is known.

Its parameters are a child module, ``position``, of what owns them: ``Parameters`` (the model
config and the arrays by name) of the attention for a layer's (``layer_params``), of the model for
those shared by every layer (``shared_params``). The hooks that act on a tile (``content_query``,
``score_term``, ``band_query``, ``band_rows``, ``bias``, ``value_term``) receive the layer's
``Parameters`` as ``own``: in the tiled path the same module, rebuilt from its arrays
(``nnx.merge``). The hooks of a whole layer (``layer_context``, ``rotate``,
``distance_tables``) receive the attention, those of the whole model (``context``, ``embed``) the
model: each reads its scheme's parameters under ``.position``.

Every logit hook sees one ``Tile``: a block of queries ``I`` against a block of keys ``J`` with their
positions, so that the dense path (one tile covering every key) and a tiled path (key tiles with an
online softmax) share the schemes. Relative distance is ``q_pos − k_pos`` (positive: the key is in
the past). The model, attention and plots name no scheme: they ask the registry.

Legend: B batch, I/J queries/keys of a tile, K keys of the window, N heads, H head dim, D model dim.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, ClassVar

import jax
import jax.numpy as jnp
import ml_collections
from flax import nnx

from relpos_jax.errors import fail


def normal_param(
    rngs: nnx.Rngs, shape: tuple[int, ...], std: float, axes: tuple[str | None, ...]
) -> nnx.Param:
    """A float32 parameter drawn from N(0, std²), its dimensions named by logical ``axes``
    (``sharding.RULES`` maps them onto the mesh; None: never split)."""
    if len(axes) != len(shape):
        raise ValueError(f"normal_param: axes {axes} do not name the {len(shape)} dimensions")
    return nnx.Param(std * jax.random.normal(rngs.params(), shape, jnp.float32), axes=axes)


class Parameters(nnx.Module):
    """A scheme's parameters, by name, as the child ``position`` of the attention (one layer's) or
    of the model (shared by every layer), with the model ``config`` the hooks read (static)."""

    def __init__(self, config: Any, params: dict[str, Any]):
        self.config = config
        for name, param in params.items():
            setattr(self, name, param)


@dataclasses.dataclass(frozen=True)
class Tile:
    """A block of queries against a block of keys of the attention window.

    ``q_pos [I]`` and ``k_pos [J]`` are the positions (traced: they count from the oldest valid key).
    ``q_start`` and ``k_start`` are where the blocks start in the window: static ints for the dense
    window, so that the tile's distances ``q_start + i − (k_start + j)`` are known when the program
    is built, whatever the positions (Transformer-XL's band of ``W_R·R`` rows is then a static
    slice); traced inside the tiled path's scans over tiles."""

    q_pos: jax.Array
    k_pos: jax.Array
    q_start: int
    k_start: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.q_pos.shape[0], self.k_pos.shape[0]

    @property
    def longest_distance(self) -> int:
        """The largest ``q − k`` in the tile: last query against first key."""
        return self.q_start + self.shape[0] - 1 - self.k_start


def floored(x: jax.Array, floor: float) -> jax.Array:
    """``max(x, floor)`` in value, ``x`` in gradient (straight through): a parameter at or below
    its floor reads as the floor and still gets the gradient of the term it feeds."""
    return x + jax.lax.stop_gradient(jnp.maximum(x, floor) - x)


class Scheme:
    """A position scheme; subclasses override only the hooks they use (the defaults add nothing)."""

    name: ClassVar[str] = ""
    relative: ClassVar[bool] = True  # what it adds depends on q_pos − k_pos only
    kv_layout: ClassVar[str] = "bnhk"  # keys/values [B, N, H, K]; "bknh" for row gathers
    content_carries_positions: ClassVar[bool] = False  # rope: positions act inside q·k itself
    fused: ClassVar[bool] = True  # its terms are tables by distance: the kernels run it
    # parameter name -> the least value it keeps: ``apply_floors`` projects it there after every
    # optimizer update (shared or per layer alike: parameters are matched by name)
    floors: ClassVar[dict[str, float]] = {}
    # its settings (``config``) that a checkpoint must match: they decide shapes or meaning
    must_match: ClassVar[tuple[str, ...]] = ()
    # a former flat ``model`` field -> the setting of ``config`` that replaced it
    renamed: ClassVar[dict[str, str]] = {}

    def config(self) -> ml_collections.ConfigDict | None:
        """This scheme's own settings with their defaults and types, ``model.<name>.<field>`` (a
        ``config_dict.placeholder`` for a None default); None: it has none."""
        return None

    def settings(self, cfg: Any) -> Any:
        """This scheme's settings in the model config ``cfg`` (``cfg.<name>``, read-only)."""
        return getattr(cfg, self.name)

    def check_settings(self, own: Any) -> None:
        """Refuse values of this scheme's own settings (``own``: ``model.<name>``) in one line
        (``errors.fail``); called for every registered scheme, whichever the config names, so that
        a bad value is refused even where another scheme runs."""

    def validate(self, cfg: Any) -> None:
        """Refuse model values this scheme cannot run with (the model config ``cfg``), in one line
        (``errors.fail``); called for the scheme the config names, after ``check_settings``."""

    def window_fields(self, cfg: Any, window: int) -> dict[str, Any]:
        """Settings of this scheme (``config``) to set from the training attention ``window``
        (memory + segment: the longest query position + 1 of a training step), where the config
        leaves them None."""
        return {}

    def scale(self, cfg: Any) -> float:
        return 1.0 / math.sqrt(cfg.head_dim)

    def shared_params(self, cfg: Any, rngs: nnx.Rngs) -> dict[str, Any]:
        """Parameters (or modules) shared by every layer: ``model.position.<name>``."""
        return {}

    def layer_params(self, cfg: Any, rngs: nnx.Rngs) -> dict[str, Any]:
        """Parameters of one layer: ``attention.position.<name>``."""
        return {}

    def context(self, model: Any, q_pos: jax.Array, k_pos: jax.Array, deterministic: bool) -> Any:
        """What every layer needs of the positions, built once per forward pass (a pytree)."""
        return None

    def layer_context(self, attention: Any, context: Any, dtype: Any) -> Any:
        """What one layer derives once from its parameters and the forward's context, before any
        tile, in the compute ``dtype`` (the queries'): the logit and value hooks see this as their
        ``context``. Linear in K at most (Transformer-XL: ``W_R·R`` for every distance, not once
        per tile)."""
        return context

    def embed(self, model: Any, x_BTD: jax.Array, q_pos: jax.Array) -> jax.Array:
        return x_BTD

    def rotate(self, attention: Any, q, k, context: Any):
        return q, k

    def content_query(self, own: Parameters, q_BINH: jax.Array, context: Any) -> jax.Array:
        return q_BINH

    def score_term(
        self, own: Parameters, q_BINH: jax.Array, k: jax.Array, tile: Tile, context: Any
    ) -> jax.Array | None:
        return None

    def band_query(self, own: Parameters, q_BINH: jax.Array, context: Any) -> jax.Array:
        """The query side ``a [B, I, N, H]`` of a band score term (inside the scaled product)."""
        raise NotImplementedError

    def band_rows(self, own: Parameters, context: Any, top, count: int) -> jax.Array:
        """Rows ``w [count, N, H]`` of distances ``top, top − 1, …`` (``top`` traced); rows of
        distances outside the scheme's range may hold anything (they feed only masked pairs)."""
        raise NotImplementedError

    def bias(self, own: Parameters, tile: Tile, context: Any) -> jax.Array | None:
        return None

    def distance_tables(self, attention: Any, context: Any, count: int) -> dict[str, jax.Array]:
        """Tables by distance ``0 … count − 1``, ``[N or 1, count, H]`` (1: shared by the heads):
        ``"key_rows"`` scored against the query inside the scaled product (``q_i·w_d``), and
        ``"value_rows"`` added to the output (``Σ_j p_ij w_d``); or a term the kernels evaluate in
        each tile, ``"tile"`` (a ``kernel.TileTerm``) with its ``"tile_rows"`` ``[N, 1, 128]``
        (FIRE). Only for terms the band and bias hooks do not give."""
        return {}

    def value_term(
        self, own: Parameters, weights_BNIJ: jax.Array, tile: Tile, context: Any
    ) -> jax.Array | None:
        return None


_REGISTRY: dict[str, Scheme] = {}


def register(cls: type[Scheme]) -> type[Scheme]:
    """Class decorator: make ``cls`` the scheme called ``cls.name``."""
    if not cls.name or cls.name in _REGISTRY:
        raise ValueError(f"register: scheme name {cls.name!r} is empty or taken")
    _REGISTRY[cls.name] = cls()
    return cls


def apply_floors(model: Any) -> None:
    """Set every parameter of ``model`` that its scheme gives a floor (``Scheme.floors``) to
    ``max(value, floor)``, in place: the projection that follows each optimizer update, as
    KERPLE's authors clamp the stored values (``param.data.clamp_(min=eps)``). Exact: a value
    pushed below its floor ends at the floor itself. Nothing to do for most schemes."""
    floors = get(model.config.position).floors
    if not floors:
        return
    for path, node in nnx.iter_graph(model):
        if isinstance(node, nnx.Param) and path and path[-1] in floors:
            node.set_value(jnp.maximum(node[...], jnp.asarray(floors[path[-1]], node.dtype)))


def renamed_fields() -> dict[str, str]:
    """Every former flat model field -> the setting that replaced it (``"shaw.max_distance"``)."""
    return {old: f"{name}.{new}" for name, scheme in _REGISTRY.items()
            for old, new in scheme.renamed.items()}  # fmt: skip


def overrides(scheme: Scheme, hook: str) -> bool:
    """Whether ``scheme`` gives its own ``hook`` (else it adds nothing there: ``Scheme``'s)."""
    return getattr(type(scheme), hook) is not getattr(Scheme, hook)


def names() -> tuple[str, ...]:
    """Every registered scheme, in registration order."""
    return tuple(_REGISTRY)


def get(name: str) -> Scheme:
    """The scheme called ``name``; an unknown name lists the registered ones."""
    if name not in _REGISTRY:
        fail("model.position", name, f"use one of {', '.join(_REGISTRY)}")
    return _REGISTRY[name]
