"""Benchmarks and research comparisons of relpos_jax, each run as ``python -m bench.<name>``."""
