"""The model's layers as one stack, run by one ``jax.lax.scan`` (MaxText's ``scan_layers``).

Every variable of the L blocks is stacked on a leading ``layers`` axis: ``stack_blocks`` builds one
``Block`` whose parameters are ``[L, ...]`` (drawn layer by layer, in the order an unrolled model
draws them, so a seed gives the same weights), and ``scan_blocks`` runs a function of one layer
over the stack, the layer's slice of the parameters and of any per-layer input (its memory) as the
scan's inputs. XLA compiles one layer, whatever the depth; ``remat`` recomputes each layer's
activations in the backward pass instead of keeping them.

Only dropout's random counters change when a layer runs: they come out of the scan stacked and are
written back; parameters and keys are read-only inputs.

Checkpoints and converters that name layers one by one (``blocks/3/attention/w_q``) are stacked by
``stack_layer_paths``; those that hold a scheme's parameters on the attention or the model itself
(``attention/w_r``, before its child ``position``) are read under today's paths by
``positioned_paths``.
Legend: L layers, B batch, T segment, D model dim.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

LAYERS_AXIS = "layers"  # the logical axis of the stack (``sharding.RULES``: replicated)


def stack_blocks(make_block: Callable[[], nnx.Module], n_layers: int) -> nnx.Module:
    """One module whose every variable is the ``n_layers`` blocks' variables stacked on axis 0,
    named ``LAYERS_AXIS`` in its ``axes`` metadata."""
    blocks = [make_block() for _ in range(n_layers)]
    graphdef = nnx.graphdef(blocks[0])
    stacked = jax.tree.map(lambda *layers: jnp.stack(layers), *map(nnx.state, blocks))
    for _, variable in nnx.to_flat_state(stacked):  # (norms, counters: no axes of their own)
        axes = variable.get_metadata().get("axes") or (None,) * (variable.ndim - 1)
        variable.set_metadata("axes", (LAYERS_AXIS, *axes))
    return nnx.merge(graphdef, stacked)


def n_layers(stack: nnx.Module) -> int:
    """L, the length of the stack's leading axis."""
    return jax.tree.leaves(nnx.state(stack, nnx.Param))[0].shape[0]


def layer(stack: nnx.Module, index: int) -> nnx.Module:
    """A copy of layer ``index`` of the stack as a block of its own (analysis, plots, tests):
    writing to it leaves the stack unchanged."""
    count = n_layers(stack)
    if not 0 <= index < count:
        raise ValueError(f"layer: index={index} is invalid; use 0…{count - 1}")
    graphdef, state = nnx.split(stack)
    return nnx.merge(graphdef, jax.tree.map(lambda a: a[index], state))


def scan_blocks(
    stack: nnx.Module,
    run_layer: Callable[[nnx.Module, jax.Array, Any], tuple[jax.Array, Any]],
    x: jax.Array,
    per_layer: Any,
    *,
    deterministic: bool = True,
    remat: bool = False,
    unroll: int = 1,
    layers: slice | None = None,
) -> tuple[jax.Array, Any]:
    """``x`` through the layers of ``stack``: ``run_layer(block, x, inputs) -> (x, outputs)`` for
    each layer in turn, ``inputs`` that layer's slice of ``per_layer`` (arrays ``[L, ...]``).
    Returns the last ``x`` and every layer's ``outputs`` stacked ``[L, ...]``. Without
    ``deterministic``, dropout's counters advance and are written back to ``stack`` (with it the
    stack is only read, so that ``jax.grad`` of a closure over the model works). ``layers`` runs a
    slice of the stack (the first few layers, for analysis); ``remat``: ``jax.checkpoint`` per
    layer; ``unroll``: layers an iteration of the scan (the depth or more: no loop, so XLA
    schedules and fuses across layers, and the compile grows with the depth)."""
    graphdef, counts, fixed = nnx.split(stack, nnx.RngCount, ...)
    if layers is not None:
        counts, fixed, per_layer = jax.tree.map(lambda a: a[layers], (counts, fixed, per_layer))

    def step(x, layer_slice):
        layer_counts, layer_fixed, inputs = layer_slice
        block = nnx.merge(graphdef, layer_counts, layer_fixed)
        x, outputs = run_layer(block, x, inputs)
        return x, (outputs, nnx.state(block, nnx.RngCount))

    if remat:
        step = jax.checkpoint(step, prevent_cse=False)
    x, (outputs, new_counts) = jax.lax.scan(step, x, (counts, fixed, per_layer), unroll=unroll)
    if not deterministic and layers is None:
        nnx.update(stack, new_counts)  # dropout drew: its counters moved
    return x, outputs


_LAYER_PATH = re.compile(r"^(?P<head>(?:.*/)?blocks)/(?P<layer>\d+)/(?P<tail>.+)$")


def stack_layer_paths(
    arrays: Mapping[str, Any], stack: Callable[[list[Any]], Any] = np.stack
) -> dict[str, Any]:
    """``{"…/blocks/<l>/<rest>": array}`` (a model that named its layers one by one) as
    ``{"…/blocks/<rest>": stack([layer 0, layer 1, …])}``; other paths unchanged. Layers must be
    0…L − 1 for every name. ``stack`` may stack anything (shapes: ``stacked_shape``)."""
    out: dict[str, Any] = {}
    grouped: dict[str, dict[int, Any]] = {}
    for path, array in arrays.items():
        match = _LAYER_PATH.match(path)
        if match is None:
            out[path] = array
            continue
        name = f"{match['head']}/{match['tail']}"
        grouped.setdefault(name, {})[int(match["layer"])] = array
    for name, by_layer in grouped.items():
        if sorted(by_layer) != list(range(len(by_layer))):
            raise ValueError(f"stack_layer_paths: {name} has layers {sorted(by_layer)}")
        out[name] = stack([by_layer[i] for i in range(len(by_layer))])
    return out


def positioned_paths(arrays: Mapping[str, Any], targets: Iterable[str]) -> dict[str, Any]:
    """``arrays`` of a model that held its scheme's parameters on the attention or the model
    themselves (``…/attention/w_r``, ``u``), under the paths of ``targets`` that hold them in the
    child ``position`` (``…/attention/position/w_r``, ``position/u``); other paths unchanged."""
    out = dict(arrays)
    for target in targets:
        parts = target.split("/")
        if "position" not in parts or target in out:
            continue
        at = parts.index("position")
        former = "/".join(parts[:at] + parts[at + 1 :])
        if former in out:
            out[target] = out.pop(former)
    return out


def stacked_shape(shapes: list[tuple[int, ...]]) -> tuple[int, ...]:
    """The shape of the layers' arrays of ``shapes`` stacked (``stack_layer_paths`` of shapes)."""
    return (len(shapes), *shapes[0])


def has_layer_paths(paths: Any) -> bool:
    """Whether any of ``paths`` names a layer one by one (``…/blocks/<l>/…``)."""
    return any(_LAYER_PATH.match(p) for p in paths)
