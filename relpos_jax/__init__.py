"""relpos_jax: position encodings for Transformers in JAX/Flax, built around Transformer-XL."""

from relpos_jax import positions

__all__ = ["positions"]
__version__ = "0.1.0"
