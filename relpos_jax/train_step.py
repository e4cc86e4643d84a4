"""One training step: the optimizer, the loss, and the jitted step with donated state.

``train_step_fn`` takes the model and optimizer state, a ``[B, T]`` batch of inputs and targets
and the memory, and returns the new state, the new memory and the step's metrics. Adam(W) with
linear warm-up and cosine decay, gradient clipping, optional micro-batching (gradient accumulation,
one scan over the micro-batches); after the update, the scheme's parameter floors
(``schemes.apply_floors``).
A step whose loss or gradients are not finite changes nothing and is counted; the memory then
starts empty. ``jitted_train_step`` compiles it once a process for a model graph and mesh.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import optax
from flax import nnx

from relpos_jax import schemes, sharding
from relpos_jax.config import Config, TrainConfig
from relpos_jax.memory import Memory
from relpos_jax.model import TransformerLM


@functools.cache  # one transformation a config: equal configs give equal graphs (``jitted_train_step``)
def make_optimizer(cfg: TrainConfig) -> optax.GradientTransformation:
    schedule = optax.warmup_cosine_decay_schedule(
        init_value=0.0 if cfg.warmup_steps else cfg.lr,
        peak_value=cfg.lr,
        warmup_steps=cfg.warmup_steps,
        decay_steps=max(cfg.steps, cfg.warmup_steps + 1),
        end_value=cfg.lr * cfg.min_lr_ratio,
    )
    if cfg.optimizer == "adamw":
        update = optax.adamw(schedule, b1=cfg.b1, b2=cfg.b2, weight_decay=cfg.weight_decay)
    else:
        update = optax.adam(schedule, b1=cfg.b1, b2=cfg.b2)
    if cfg.clip > 0:
        update = optax.chain(optax.clip_by_global_norm(cfg.clip), update)
    # A step whose gradients hold a NaN or Inf changes neither the parameters nor the optimizer
    # state, and is counted (total_notfinite); the loop then stops the run or, with
    # train.skip_nonfinite, goes on (and stops after max_consecutive_skips in a row).
    return optax.apply_if_finite(update, max_consecutive_errors=cfg.max_consecutive_skips)


def build(cfg: Config) -> tuple[TransformerLM, nnx.Optimizer]:
    """A new model (initialised from ``train.seed``) and its optimizer."""
    model = TransformerLM(
        cfg.model, rngs=nnx.Rngs(params=cfg.train.seed, dropout=cfg.train.seed + 1)
    )
    return model, nnx.Optimizer(model, make_optimizer(cfg.train), wrt=nnx.Param)


def segment_loss(model, inputs, targets, mems, loss_from: int = 0):
    """The mean cross-entropy of one segment (dropout on) from its position ``loss_from`` on
    (``train.loss_from``; 0: every position), and the memory after it."""
    log_probs, new_mems = model.target_log_probs(inputs, targets, mems, deterministic=False)
    return -log_probs[:, loss_from:].mean(), new_mems


def _micro_batches(tree, parts: int, axis: int):
    """Every array of ``tree`` split along ``axis`` into ``parts`` stacked on a new leading axis."""

    def split(a):
        shape = (*a.shape[:axis], parts, a.shape[axis] // parts, *a.shape[axis + 1 :])
        return jnp.moveaxis(a.reshape(shape), axis, 0)

    return jax.tree.map(split, tree)


def _accumulated(model, grad_accum: int, batch, mems: Memory, loss_from: int):
    """``(loss, new memory, gradients)`` of the batch as ``grad_accum`` micro-batches of its rows,
    one ``jax.lax.scan`` (one micro-batch is compiled, whatever their number): the gradients
    summed over the micro-batches and averaged, the losses averaged, each micro-batch with its
    rows of the memory. Dropout's random state is carried from one micro-batch to the next."""
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    parts = {
        "inputs": _micro_batches(batch["inputs"], grad_accum, axis=0),
        "targets": _micro_batches(batch["targets"], grad_accum, axis=0),
        "states": _micro_batches(mems.states, grad_accum, axis=1),
    }

    def part_loss(params, rest, part):
        micro_model = nnx.merge(graphdef, params, rest, copy=True)  # variables of this trace
        part_mems = Memory(part["states"], mems.valid)
        loss, new_mems = segment_loss(
            micro_model, part["inputs"], part["targets"], part_mems, loss_from
        )
        return loss, (new_mems, nnx.state(micro_model, nnx.Not(nnx.Param)))

    def micro_step(carry, part):
        rest, grads = carry
        (loss, (part_mems, rest)), part_grads = jax.value_and_grad(part_loss, has_aux=True)(
            params, rest, part
        )
        return (rest, jax.tree.map(jnp.add, grads, part_grads)), (loss, part_mems)

    zeros = jax.tree.map(jnp.zeros_like, params)
    (rest, grads), (losses, part_mems) = jax.lax.scan(micro_step, (rest, zeros), parts)
    nnx.update(model, rest)
    states = jnp.moveaxis(part_mems.states, 0, 1)  # [L, parts, rows, M, D]
    new_mems = Memory(states.reshape(mems.states.shape), part_mems.valid[-1])
    return losses.mean(), new_mems, jax.tree.map(lambda g: g / grad_accum, grads)


def train_step_fn(graphdef, grad_accum: int, state, batch, mems: Memory, *, loss_from: int = 0):
    """One optimizer step -> (new state, new memory, metrics). Micro-batches split the rows; the
    loss counts each segment's positions from ``loss_from`` on."""
    model, optimizer = nnx.merge(graphdef, state)
    if grad_accum == 1:
        grad_fn = nnx.value_and_grad(segment_loss, has_aux=True)
        (loss, new_mems), grads = grad_fn(model, batch["inputs"], batch["targets"], mems, loss_from)
    else:
        loss, new_mems, grads = _accumulated(model, grad_accum, batch, mems, loss_from)
    grad_norm = optax.tree.norm(grads)
    finite = jnp.isfinite(loss) & jnp.isfinite(grad_norm)
    # A NaN loss can come with finite gradients (e.g. from a branch with zero derivative): make the
    # optimizer's apply_if_finite see it too, so that such a step changes nothing either.
    grads = jax.tree.map(lambda g: jnp.where(finite, g, jnp.nan), grads)
    optimizer.update(model, grads)
    # The scheme's parameter floors (KERPLE's r1, r2 ≥ 1e-2), projected onto the stored values
    # after the update, exactly, as the authors' clamp_; a skipped step changed nothing to project.
    schemes.apply_floors(model)
    # After a non-finite step the memory may hold NaNs too: start the next segment without context.
    new_mems = jax.tree.map(
        lambda new, empty: jnp.where(finite, new, empty),
        new_mems,
        jax.tree.map(jnp.zeros_like, mems),
    )
    metrics = {
        "loss": loss,
        "grad_norm": grad_norm,
        "finite": finite,
        "skipped": optimizer.opt_state.total_notfinite[...],
        # non-finite steps in a row, as the optimizer counts them: saved with it, so a run resumed
        # in the middle of a streak goes on counting (apply_if_finite applies the next step after
        # max_consecutive_skips; the loop stops the run at that count)
        "in_a_row": optimizer.opt_state.notfinite_count[...],
    }
    return nnx.state((model, optimizer)), new_mems, metrics


@functools.cache
def jitted_train_step(graphdef, grad_accum: int, state_sharding: tuple, mesh, loss_from: int = 0):
    """The jitted ``train_step_fn`` of a model graph, accumulation, state sharding (as
    ``(treedef, leaves)``, hashable), mesh and ``train.loss_from``, made once a process: the
    Trainers of one run (a resume, a rerun in a notebook) share its trace and its compiled program.
    The batch, memory and metrics shardings follow from the mesh."""
    state = jax.tree.unflatten(*state_sharding)
    mems = sharding.memory_sharding(mesh)
    step = sharding.under_mesh(mesh, train_step_fn)  # keeps its name: compiles are counted by it
    return jax.jit(
        functools.partial(step, graphdef, grad_accum, loss_from=loss_from),
        in_shardings=(state, sharding.batch_sharding(mesh), mems),
        out_shardings=(state, mems, sharding.replicated(mesh)),
        donate_argnums=(0, 2),
    )
