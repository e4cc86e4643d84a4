"""Position encodings as pure ``jax.numpy`` functions: no Flax, no state, jit/vmap/grad-safe.

One sign convention everywhere: ``rel = q_pos − k_pos`` (positive: the key is in the past).
One file per family; each documents its formula and source paper.
"""

from relpos_jax.positions.absolute import learned_lookup, learned_table_init, sinusoid
from relpos_jax.positions.alibi import alibi_bias, alibi_slopes
from relpos_jax.positions.deberta import (
    deberta_bucket,
    deberta_c2p,
    deberta_index,
    deberta_p2c,
    deberta_scale,
)
from relpos_jax.positions.rope import (
    ROPE_TYPES,
    apply_rope,
    rope_cos_sin,
    rope_inv_freq,
    rotate,
    rotate_columns,
)
from relpos_jax.positions.shaw import (
    shaw_index,
    shaw_key_logits,
    shaw_rel_index,
    shaw_value_output,
)
from relpos_jax.positions.t5 import t5_bias, t5_bucket
from relpos_jax.positions.transformer_xl import (
    position_logits as txl_position_logits,
)
from relpos_jax.positions.transformer_xl import (
    rel_shift,
    relative_distances,
    relative_sinusoid,
)

__all__ = [
    "ROPE_TYPES",
    "alibi_bias",
    "alibi_slopes",
    "apply_rope",
    "deberta_bucket",
    "deberta_c2p",
    "deberta_index",
    "deberta_p2c",
    "deberta_scale",
    "learned_lookup",
    "learned_table_init",
    "rel_shift",
    "relative_distances",
    "relative_sinusoid",
    "rope_cos_sin",
    "rope_inv_freq",
    "rotate",
    "rotate_columns",
    "shaw_index",
    "shaw_key_logits",
    "shaw_rel_index",
    "shaw_value_output",
    "sinusoid",
    "t5_bias",
    "t5_bucket",
    "txl_position_logits",
]
