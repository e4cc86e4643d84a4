"""What the research sweeps share, each written once: the schemes they compare, a run's config file,
overrides and name, and the peers' names for our schemes (x-transformers).

The sweeps (``experiments.ablation``, ``extrapolation``, ``recl``, ``probes``, ``compare_training``),
the notebooks (``notebooks/checkpoints.py``) and ``bench.speed`` (x-transformers as a speed peer)
read these; a run's command lines come from ``experiments.sweep``.
"""

from __future__ import annotations

from bench.measure import ROOT
from relpos_jax.config import POSITIONS, load_config

# The schemes that encode positions; the ablation compares them and "none" (NoPE), the baseline
# without any.
SCHEMES = tuple(p for p in POSITIONS if p != "none")
# The extrapolation sweep's default schemes: NoPE and every scheme but the learned table, which has
# no position beyond the trained length.
EXTRAPOLATION_SCHEMES = ("none", *(s for s in SCHEMES if s != "learned"))
# The memory probes' default: the relative schemes (and RoPE), every one the core ablation trains
PROBE_SCHEMES = ("txl", "shaw", "t5", "deberta", "alibi", "rope", "fire", "kerple")

# x-transformers' closest option to each scheme (a ``Decoder`` keyword; "absolute": its absolute
# position embedding): the speed peer of ``bench.speed``; T5's bucketed bias stands in for
# Transformer-XL's, which it lacks.
X_TRANSFORMERS = {
    "txl": "rel_pos_bias",
    "t5": "rel_pos_bias",
    "rope": "rotary_pos_emb",
    "alibi": "alibi_pos_bias",
    "sinusoid": "absolute",
}
# The schemes x-transformers offers as ours are (its option is the same scheme): those trained side
# by side with ours (``experiments.compare_training``).
X_TRANSFORMERS_SAME = ("alibi", "t5", "rope")


def x_transformers_options(scheme: str, t5=None) -> dict:
    """The ``x_transformers.Decoder`` keywords of ``scheme``'s position option (none for "absolute",
    which ``TransformerWrapper(use_abs_pos_emb=True)`` takes); ``t5``: a config's ``model.t5``
    (buckets and maximum distance) for the T5 bias, else x-transformers' defaults."""
    option = X_TRANSFORMERS[scheme]
    if option == "absolute":
        return {}
    if scheme == "t5" and t5 is not None:
        return {option: True, "rel_pos_num_buckets": t5.num_buckets,
                "rel_pos_max_distance": t5.max_distance}  # fmt: skip
    return {option: True}


def config_file(scheme: str) -> str:
    """A scheme's config, relative to the repository: txl_small.py for txl, else <scheme>_small.py
    (txl_small's sizes, data and hyperparameters; only the position scheme differs)."""
    return "configs/txl_small.py" if scheme == "txl" else f"configs/{scheme}_small.py"


def overrides(mem_len: int, seed: int, sets=()) -> list[str]:
    """The config overrides of one run (``--set`` ones last, so that they win)."""
    return [f"model.mem_len={mem_len}", f"train.seed={seed}", *sets]


def config_for(scheme: str, mem_len: int, seed: int, sets=()):
    """The ConfigDict of one run, as its ``train.py`` flags build it (for in-process evaluation)."""
    return load_config(ROOT / config_file(scheme), overrides(mem_len, seed, sets))


def scheme_of(label: str) -> str:
    """The position scheme of a table row's label: ``sinusoid+half`` (trained on half loss) and
    ``rope+linear`` (an extension) are rows of sinusoid and rope."""
    return label.split("+")[0]


def label_order(label: str) -> tuple[int, str]:
    """A sort key for row labels: by scheme, in the registry's order, then the label."""
    return POSITIONS.index(scheme_of(label)), label


def run_name(scheme: str, mem_len: int, seed: int) -> str:
    """A run's name, and its folder's under ``--runs``: the ablation's (and RECL's, which scores
    them), compare_training's."""
    return f"{scheme}_mem{mem_len}_seed{seed}"


def extrapolation_run_name(scheme: str, variant: str, train_len: int, seed: int) -> str:
    """An extrapolation run's name and folder (``variant``: defaults or sized tables)."""
    return f"{scheme}_{variant}_len{train_len}_seed{seed}"
