# The two commands of the README. A virtual environment is created on first use from
# pyproject.toml, with the versions pinned in constraints.txt (reproducible installs).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1)

.PHONY: run test test-bench test-peers test-convert test-tpu test-cubin lint demo bench notebooks clean gpu-wheels

# Command 1: set up and run the main job.
run: $(STAMP)
	$(PY) train.py --config configs/txl_small.py

# Command 2: set up and run the test suite (pytest's own exit code: 5, no tests, fails too).
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(PY) -m pytest -n 2 --durations=10 -m "not bench"

# The end-to-end runs of the benchmark scripts that `make test` leaves out (minutes of compiling in
# the fresh process every benchmark cell starts); the cheap ones run in `make test` too.
test-bench: $(STAMP)
	$(PY) -m pytest -n 2 -ra -m bench tests/bench/bench_smoke_test.py \
		tests/experiments/experiments_smoke_test.py

# The tests of the PyTorch peers that bench/ runs beside relpos_jax, which `make test` (and CI) skip:
# they need the bench extra (CPU PyTorch, x-transformers), installed here into the same venv.
# OFFICIAL_TXL_DIR=<the pytorch/ folder of a kimiyoung/transformer-xl checkout> adds the official code.
test-peers: $(STAMP)
	$(PY) -m pip install --quiet -c constraints.txt -e ".[test,bench]"
	OFFICIAL_TXL_DIR="$(OFFICIAL_TXL_DIR)" $(PY) -m pytest -n 0 -ra tests/bench/official_txl_test.py

# The tests of relpos_jax.convert (the released Transformer-XL models from HuggingFace and the official
# TensorFlow checkpoints), which `make test` (and CI) skip: they need the convert extra (CPU PyTorch,
# transformers, TensorFlow), installed into a venv of its own so that TensorFlow never lands in .venv.
CONVERT_VENV ?= .venv-convert
CONVERT_STAMP := $(CONVERT_VENV)/.installed-$(shell cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1)

test-convert: $(CONVERT_STAMP)
	JAX_PLATFORMS=cpu $(CONVERT_VENV)/bin/python -m pytest -n 0 -ra tests/convert/convert_test.py \
		tests/convert/convert_fuzz_checkpoints_test.py

$(CONVERT_STAMP): pyproject.toml constraints.txt
	test -x $(CONVERT_VENV)/bin/python || $(PYTHON) -m venv $(CONVERT_VENV)
	$(CONVERT_VENV)/bin/python -m pip install --quiet -c constraints.txt -e ".[test,convert]"
	rm -f $(CONVERT_VENV)/.installed-* && touch $@

# The deviceless TPU compiles (tests/tpu_compile_test.py: every scheme's Mosaic kernels, slices of
# several hosts, bench.aot), which `make test` (and CI) skip: they need libtpu (the tpu extra), installed
# into a venv of its own so that .venv stays a CPU one. XLA_FLAGS empty: the TPU compiler at its defaults.
TPU_VENV ?= .venv-tpu
TPU_STAMP := $(TPU_VENV)/.installed-$(shell cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1)

test-tpu: $(TPU_STAMP)
	JAX_PLATFORMS=cpu XLA_FLAGS= $(TPU_VENV)/bin/python -m pytest -n 2 -ra tests/tpu_compile_test.py

$(TPU_STAMP): pyproject.toml constraints.txt
	test -x $(TPU_VENV)/bin/python || $(PYTHON) -m venv $(TPU_VENV)
	$(TPU_VENV)/bin/python -m pip install --quiet -c constraints.txt -e ".[test,tpu]"
	rm -f $(TPU_VENV)/.installed-* && touch $@

# The Triton kernels compiled to cubin for sm_90 and sm_80 without a GPU
# (tests/attention/kernel/kernel_cubin_test.py: shared memory within the chip's, spills within
# budget, no scratch read pipelined ahead of its store), which `make test` (and CI) skip: they need
# the triton wheel (the cubin extra, 300 MB), installed into a venv of its own.
CUBIN_VENV ?= .venv-cubin
CUBIN_STAMP := $(CUBIN_VENV)/.installed-$(shell cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1)

test-cubin: $(CUBIN_STAMP)
	JAX_PLATFORMS=cpu $(CUBIN_VENV)/bin/python -m pytest -n 2 -ra tests/attention/kernel/kernel_cubin_test.py

$(CUBIN_STAMP): pyproject.toml constraints.txt
	test -x $(CUBIN_VENV)/bin/python || $(PYTHON) -m venv $(CUBIN_VENV)
	$(CUBIN_VENV)/bin/python -m pip install --quiet -c constraints.txt -e ".[test,cubin]"
	rm -f $(CUBIN_VENV)/.installed-* && touch $@

# Runs every notebook top to bottom and keeps its outputs in the .ipynb (the committed ones come from
# here): with the sweeps' checkpoints in runs/ where present (python -m experiments.ablation,
# experiments.extrapolation), else small models trained on the spot. Needs the notebooks extra (a kernel and nbclient).
notebooks: $(STAMP)
	$(PY) -m pip install --quiet -c constraints.txt -e ".[test,notebooks]"
	cd notebooks && ../$(VENV)/bin/jupyter-execute --inplace --timeout=3600 *.ipynb

# The wheels that bench/gpu.sh installs on a GPU machine without network (.whl/, git-ignored): what
# relpos_jax imports and the machine's image lacks, for CPython 3.12 on x86-64, at constraints.txt's pins.
gpu-wheels:
	bash bench/gpu_wheels.sh

lint: $(STAMP)
	$(VENV)/bin/ruff check . && $(VENV)/bin/ruff format --check .

demo: $(STAMP)
	$(PY) -m relpos_jax.analysis.demo

bench: $(STAMP)
	$(PY) -m bench.positions

$(STAMP): pyproject.toml constraints.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet -c constraints.txt -e ".[test]"
	rm -f $(VENV)/.installed-* && touch $@

clean:
	rm -rf $(VENV) $(CONVERT_VENV) $(TPU_VENV) .pytest_cache
