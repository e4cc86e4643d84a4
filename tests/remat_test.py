"""``model.remat``: recomputing each layer in the backward pass changes memory, never the numbers."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from tests.helpers import tiny_model


def _loss_and_grads(remat: bool, position: str):
    model = tiny_model(position, remat=remat, dropout=0.2, dropatt=0.1)
    tokens = jax.random.randint(jax.random.key(1), (2, 9), 0, 256)
    return _compiled_loss_and_grads(model, tokens)


@nnx.jit
def _compiled_loss_and_grads(model, tokens):
    _, mems = model(tokens[:, :8], model.init_mems(2))  # a full memory: the window crosses it

    def loss_fn(model):
        logits, new_mems = model(tokens[:, :8], mems, deterministic=False)
        loss = optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()
        return loss, new_mems

    (loss, new_mems), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
    return loss, new_mems.states, grads


@pytest.mark.parametrize("position", ["txl", "shaw"])
def test_remat_gives_the_same_loss_gradients_and_memory(position):
    plain = _loss_and_grads(False, position)
    recomputed = _loss_and_grads(True, position)
    assert float(plain[0]) > 0
    np.testing.assert_allclose(plain[0], recomputed[0], rtol=1e-6)
    np.testing.assert_allclose(plain[1], recomputed[1], rtol=1e-6, atol=1e-6)
    for a, b in zip(jax.tree.leaves(plain[2]), jax.tree.leaves(recomputed[2]), strict=True):
        np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6)


def test_remat_recomputes_in_the_backward_pass():
    """The compiled gradient of a remat model runs each layer's forward products again (XLA does not
    merge the recomputation away). On XLA:CPU this does not lower the peak temporary memory at these
    sizes (its scheduler does not minimise memory); the saving is the accelerators' business."""
    sizes = dict(d_model=64, n_heads=4, d_ff=256, n_layers=4, mem_len=32)
    products = {}
    for remat in (False, True):
        model = tiny_model("txl", remat=remat, **sizes)
        graphdef, params, rest = nnx.split(model, nnx.Param, ...)
        tokens = jnp.zeros((4, 65), jnp.int32)

        def loss(params, rest, graphdef=graphdef, tokens=tokens):
            logits, _ = nnx.merge(graphdef, params, rest)(tokens[:, :-1])
            return optax.softmax_cross_entropy_with_integer_labels(logits, tokens[:, 1:]).mean()

        compiled = jax.jit(jax.grad(loss)).lower(params, rest).compile()
        products[remat] = compiled.as_text().count(" dot(")
    assert products[True] > products[False] > 0
