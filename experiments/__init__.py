"""Research sweeps of relpos_jax and their renderers (bpc, RECL, extrapolation, probes, the papers'
claims), each run as ``python -m experiments.<name>``; results in docs/results/."""
