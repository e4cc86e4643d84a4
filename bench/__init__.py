"""Performance benchmarks of relpos_jax (speed, MFU, memory, compile time, TPU compiles, kernels, the
accelerator's bench/gpu.sh), each run as ``python -m bench.<name>``; results in docs/benchmarks/."""
