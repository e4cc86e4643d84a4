# The two commands of the README. A virtual environment is created on first use from
# pyproject.toml, with the versions pinned in constraints.txt (reproducible installs).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml constraints.txt | cksum | cut -d' ' -f1)

.PHONY: run test lint demo bench clean

# Command 1: set up and run the main job.
run: $(STAMP)
	$(PY) train.py --config configs/txl_small.py

# Command 2: set up and run the test suite (pytest's own exit code: 5, no tests, fails too).
test: $(STAMP)
	$(VENV)/bin/ruff check .
	$(PY) -m pytest -n 2 --durations=10

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
	rm -rf $(VENV) .pytest_cache
