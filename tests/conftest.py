"""Shared fixtures: float64 for reference comparisons, a seeded numpy generator, a tiny run."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from relpos_jax.config import load_config
from tests.helpers import ROOT


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
