"""Shared fixtures: float64 for reference comparisons, a seeded numpy generator, a tiny run.

The suite's time is mostly XLA compiling small programs, so two settings, inherited by every
subprocess the tests start (the CLI, the benchmarks, the notebooks):

* every compiled program, the single operations of eager calls included, goes to JAX's persistent
  compilation cache in ``.pytest_cache/jax/<xdist worker>``: a worker and the subprocesses it
  starts (one at a time) compile each program once between them, and a later run of the suite
  compiles nothing it compiled before. One folder a worker, because JAX writes an entry in place:
  a process that reads an entry while another writes it (or after a SIGKILL cut it short) can
  crash in deserialising it (``tests.helpers.kill_when_logged`` gives the processes it kills a
  cache of their own);
* after each test module, the worker lets go of the programs it compiled (``jax.clear_caches``):
  each XLA:CPU executable maps about three regions of memory, and a worker that kept every one
  reached the kernel's limit of 65,530 maps a process (``vm.max_map_count``) some 450 tests in and
  died with a segmentation fault in the next compile (52,511 maps were counted in a worker at 80 %
  of a run). A later module that compiles the same program reads it from the persistent cache;
* XLA:CPU's backend optimisations and its MLIR fusion emitters are off (``XLA_FLAGS``, unless
  already set): a small training step compiles in about half the time (6.5 s instead of 11 s for
  four schemes' first steps) and runs at much the same speed at the tests' sizes. HLO-level passes
  (fusion, buffer assignment, the layouts the precision tests read) are unchanged; only the code
  emitted for each fusion differs."""

from __future__ import annotations

import gc
import os
import pathlib

_CACHE = pathlib.Path(__file__).resolve().parent.parent / ".pytest_cache" / "jax"
if "JAX_COMPILATION_CACHE_DIR" not in os.environ or os.environ.get("RELPOS_JAX_TEST_CACHE"):
    # set here (in the xdist controller too, whose environment the workers inherit): per worker
    worker = os.environ.get("PYTEST_XDIST_WORKER", "main")
    os.environ["JAX_COMPILATION_CACHE_DIR"] = str(_CACHE / worker)  # inherited by subprocesses
    os.environ["RELPOS_JAX_TEST_CACHE"] = "1"
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0")
os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES", "0")
os.environ.setdefault(
    "XLA_FLAGS",
    "--xla_backend_optimization_level=0 --xla_llvm_disable_expensive_passes=true "
    "--xla_cpu_use_fusion_emitters=false",
)

import jax  # noqa: E402  (after the cache settings, which jax reads when imported)
import numpy as np  # noqa: E402
import pytest  # noqa: E402

from relpos_jax.config import load_config  # noqa: E402
from tests.helpers import ROOT  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def _release_compiled_programs():
    """A module's compiled programs freed after it (see the module's docstring)."""
    yield
    jax.clear_caches()
    gc.collect()


@pytest.fixture
def x64():
    """Run the fast form in float64 so that it can be held to the float64 reference."""
    with jax.enable_x64(True):
        yield


@pytest.fixture
def rng() -> np.random.Generator:
    return np.random.default_rng(0)


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """txl_small shrunk to 1 layer of width 32 on a generated 6,000-word corpus: (config, root)."""
    root = tmp_path_factory.mktemp("tiny")
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "(", ")", ":", "\n", "    "]
    (root / "corpus.txt").write_text(" ".join(rng.choice(words, 6000)))
    config = load_config(ROOT / "configs" / "txl_small.py")
    config.model.update(n_layers=1, d_model=32, n_heads=2, d_ff=64, mem_len=8, dropout=0.1)
    config.data.update(
        name="text",
        path=str(root / "corpus.txt"),
        dir=str(root / "tfds"),
        segment_len=8,
        batch_size=4,
    )
    config.train.update(
        steps=8, log_every=1, eval_every=4, eval_tokens=200, ckpt_every=4, warmup_steps=2
    )
    config.eval.update(segment_len=6, mem_len=20, batch_size=3)
    return config, root
