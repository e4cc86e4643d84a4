"""relpos_jax: position encodings for Transformers in JAX/Flax, built around Transformer-XL."""

from relpos_jax import positions
from relpos_jax.config import ConfigError, ModelConfig, load_config
from relpos_jax.generate import generate
from relpos_jax.memory import Memory, init_mems, run_segments
from relpos_jax.model import TransformerLM

__all__ = [
    "ConfigError",
    "Memory",
    "ModelConfig",
    "TransformerLM",
    "generate",
    "init_mems",
    "load_config",
    "positions",
    "run_segments",
]
__version__ = "0.1.0"
