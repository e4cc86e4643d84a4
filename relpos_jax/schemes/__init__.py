"""Position schemes as plug-ins: one module per scheme, registered by name (``schemes.base``).

Every module of this folder is imported here, and registers its scheme: a new scheme is one new
file. The model, attention, plots, sharding and benches ask the registry (``names``, ``get``) and
name no scheme.
"""

import importlib
import pkgutil

from relpos_jax.schemes.base import (
    Parameters,
    Scheme,
    Tile,
    apply_floors,
    floored,
    get,
    names,
    normal_param,
    overrides,
    register,
    renamed_fields,
)

# The order of ``names()`` (tables, sweeps): the classic schemes as the comparisons list them, then
# every other module of the folder in alphabetical order.
CLASSIC = ("txl", "shaw", "t5", "alibi", "rope", "sinusoid", "learned", "deberta", "none")
_OTHERS = sorted({m.name for m in pkgutil.iter_modules(__path__)} - {*CLASSIC, "base"})
for _module in (*CLASSIC, *_OTHERS):
    importlib.import_module(f"{__name__}.{_module}")

__all__ = [
    "Parameters",
    "Scheme",
    "Tile",
    "apply_floors",
    "floored",
    "get",
    "names",
    "normal_param",
    "overrides",
    "register",
    "renamed_fields",
]
