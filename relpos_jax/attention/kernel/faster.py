"""Where ``model.attention_impl=auto`` takes the Pallas kernels on a GPU: only where a GPU of the
same kind measured them faster than both the dense and the tiled path (``faster.json``, written by
``python -m bench.gpu_render --faster`` from ``bash bench/gpu.sh``'s attention table). The kernels
are taken for a query length at or beyond the shortest measured one where they won, up to the
next measured length where they lost. Nothing measured (the table ships empty until a GPU run
fills it): ``auto`` takes dense or tiled there."""

from __future__ import annotations

import functools
import json
import pathlib

TABLE = pathlib.Path(__file__).with_name("faster.json")


@functools.cache
def _devices() -> dict[str, dict[str, dict[str, bool]]]:
    return json.loads(TABLE.read_text())["devices"]


def measured_faster(device_kind: str | None, scheme: str, queries: int) -> bool:
    """Whether the kernels were measured faster for ``scheme`` on this kind of GPU at the longest
    measured query length not beyond ``queries`` (False where none was measured)."""
    by_length = _devices().get(device_kind or "", {}).get(scheme, {})
    lengths = sorted(int(n) for n in by_length if int(n) <= queries)
    return bool(lengths) and by_length[str(lengths[-1])]
