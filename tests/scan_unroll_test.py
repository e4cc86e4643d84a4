"""``model.scan_unroll``: layers an iteration of the layers' scan. Unrolled, the program has no
loop over the layers (XLA may then fuse and schedule across them); the numbers never change."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from relpos_jax import ConfigError
from tests.helpers import tiny_model
from tests.remat_test import _compiled_loss_and_grads


def _loss_and_grads(position: str, unroll: int):
    model = tiny_model(position, n_layers=3, scan_unroll=unroll, dropout=0.2, dropatt=0.1)
    tokens = jax.random.randint(jax.random.key(1), (2, 9), 0, 256)
    return _compiled_loss_and_grads(model, tokens)


@pytest.mark.parametrize("position", ["txl", "rope"])
def test_unrolled_layers_give_the_same_loss_gradients_and_memory(position):
    scanned = _loss_and_grads(position, 1)
    for unroll in (2, 3):  # a remainder of one layer, and no loop at all
        unrolled = _loss_and_grads(position, unroll)
        np.testing.assert_allclose(unrolled[0], scanned[0], rtol=1e-6)
        np.testing.assert_allclose(unrolled[1], scanned[1], rtol=1e-6, atol=1e-6)
        for a, b in zip(jax.tree.leaves(unrolled[2]), jax.tree.leaves(scanned[2]), strict=True):
            np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)


def test_a_fully_unrolled_forward_has_no_loop_over_the_layers():
    for unroll, loops in ((1, True), (3, False)):
        model = tiny_model("txl", n_layers=3, scan_unroll=unroll)
        tokens = np.zeros((1, 4), np.int32)
        text = jax.jit(lambda t, model=model: model(t)[0]).lower(tokens).as_text()
        assert ("stablehlo.while" in text) == loops, unroll


def test_a_scan_unroll_below_one_is_refused_in_one_line():
    with pytest.raises(ConfigError, match=r"model\.scan_unroll") as error:
        tiny_model("txl", scan_unroll=0)
    assert "\n" not in str(error.value)
