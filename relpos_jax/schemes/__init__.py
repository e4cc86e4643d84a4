"""Position schemes as plug-ins: one module per scheme, registered by name (``schemes.base``).

A new scheme is one new module here, imported below; the model, attention, plots, sharding and
benches ask the registry (``names``, ``get``) and name no scheme.
"""

from relpos_jax.schemes.base import Scheme, Tile, get, names, normal_param, register

# isort: off
# Each module registers its scheme; this order is the order of ``names()`` (tables, sweeps).
from relpos_jax.schemes import txl, shaw, t5, alibi, rope, sinusoid, learned, deberta, none  # noqa: F401
# isort: on

__all__ = ["Scheme", "Tile", "get", "names", "normal_param", "register"]
