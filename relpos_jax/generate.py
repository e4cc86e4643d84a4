"""Sampling with the segment memory as the cache: one token per step, nothing recomputed.

The prompt goes through the model as one segment; then each step feeds the last token with the
memory of every layer, as Transformer-XL evaluates (its Table 9 speed-up); the memory is a
``KeyValueMemory``, so a step projects only its own token's keys and values. With a memory as long as
prompt + new tokens (the default) the result equals recomputing the full context at every step;
a shorter ``mem_len`` gives the model's bounded context instead.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from flax import nnx

from relpos_jax.memory import segment_step


def sample_logits(
    logits: jax.Array, rng: jax.Array, temperature: float, top_k: int | None
) -> jax.Array:
    """Greedy for ``temperature == 0``; else softmax(logits / temperature), cut to the top k."""
    if temperature == 0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logits = logits / temperature
    if top_k is not None:
        kth = jax.lax.top_k(logits, top_k)[0][..., -1:]
        logits = jnp.where(logits < kth, -jnp.inf, logits)
    return jax.random.categorical(rng, logits, axis=-1).astype(jnp.int32)


@functools.partial(jax.jit, static_argnames=("graphdef", "n", "mem_len", "temperature", "top_k"))
def _generate(graphdef, state, prompt, rng, *, n, mem_len, temperature, top_k):
    model = nnx.merge(graphdef, state)

    def next_token(logits, segment):  # the readout: a sample after the segment's last position
        return sample_logits(logits[:, -1], segment["rng"], temperature, top_k)

    step = segment_step(model, next_token)
    rngs = jax.random.split(rng, n)
    mems = model.init_mems(prompt.shape[0], mem_len, keys_values=True)
    mems, first = step(mems, {"inputs": prompt, "rng": rngs[0]})

    def decode(carry, step_rng):
        token, mems = carry
        mems, following = step(mems, {"inputs": token[:, None], "rng": step_rng})
        return (following, mems), following

    _, rest = jax.lax.scan(decode, (first, mems), rngs[1:])
    return jnp.concatenate([first[:, None], rest.swapaxes(0, 1)], axis=1)


def generate(
    model: nnx.Module,
    prompt: jax.Array,
    n: int,
    *,
    rng: jax.Array | None = None,
    temperature: float = 1.0,
    top_k: int | None = None,
    mem_len: int | None = None,
) -> jax.Array:
    """``n`` new tokens ``[B, n]`` after ``prompt [B, P]``; compiled once per shape and setting."""
    if prompt.ndim != 2 or prompt.shape[1] < 1:
        raise ValueError(
            f"generate: prompt.shape={prompt.shape} is invalid; pass [batch, length ≥ 1] ints"
        )
    if n < 1:
        raise ValueError(f"generate: n={n} is invalid; ask for at least 1 token")
    if temperature < 0:
        raise ValueError(f"generate: temperature={temperature} is invalid; use 0 (greedy) or more")
    if top_k is not None and not 1 <= top_k <= model.config.vocab_size:
        raise ValueError(
            f"generate: top_k={top_k} is invalid; use 1 … {model.config.vocab_size} or None"
        )
    graphdef, state = nnx.split(model)
    return _generate(
        graphdef,
        state,
        jnp.asarray(prompt, jnp.int32),
        jax.random.PRNGKey(0) if rng is None else rng,
        n=n,
        mem_len=prompt.shape[1] + n if mem_len is None else mem_len,
        temperature=float(temperature),
        top_k=top_k,
    )
