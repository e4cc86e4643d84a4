"""Memory of keys and values against memory of hidden states: evaluation and generation, in one run.

    .venv/bin/python -m bench.key_value_memory [--scheme txl] [--size small] [--rounds 5]
        [--settings 128:128,80:2100,128:1024] [--generate 1024] [--dtype float32]

The same model and weights run each way in one process, alternating, so that the host's load falls
on both alike: ``model.init_mems(B, M)`` (each layer's hidden states, projected again into keys and
values for every segment, as Transformer-XL's and x-transformers' code do) and ``model.init_mems(B,
M, keys_values=True)`` (each layer's projected keys and values, what ``evaluate``, ``generate``,
``recl`` and ``probing`` use). Evaluation: tokens/s of one segment of T tokens after a full memory
of M, for each ``T:M`` of ``--settings`` (``80:2100`` is the paper's enwik8 test protocol).
Generation: tokens/s of 32 greedy steps of one token each after a full memory of ``--generate``
tokens. Prints a markdown table with the median of ``--rounds`` rounds and the speed-up.
"""

from __future__ import annotations

import statistics
import time

from bench import args as options
from bench.measure import SIZES, VOCAB, our_model
from relpos_jax.config import POSITIONS

GENERATED = 32


def _timer(call):
    call()  # compile
    call()

    def seconds():
        start = time.perf_counter()
        call()
        return time.perf_counter() - start

    return seconds


def evaluation(model, batch: int, seg: int, mem: int, keys_values: bool):
    """Seconds of one evaluation segment after a full memory."""
    import jax
    from flax import nnx

    graphdef, state = nnx.split(model)

    @jax.jit
    def forward(state, tokens, mems):
        return nnx.merge(graphdef, state)(tokens, mems)

    tokens = jax.random.randint(jax.random.key(0), (batch, seg), 0, VOCAB)
    mems = model.init_mems(batch, mem, keys_values=keys_values)
    for _ in range(-(-mem // seg)):  # fill the memory
        _, mems = forward(state, tokens, mems)
    return _timer(lambda: jax.block_until_ready(forward(state, tokens, mems)))


def generation(model, batch: int, mem: int, keys_values: bool):
    """Seconds of ``GENERATED`` greedy steps after a full memory of ``mem`` tokens."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    graphdef, state = nnx.split(model)

    @jax.jit
    def prefill(state, prompt, mems):
        return nnx.merge(graphdef, state)(prompt, mems)[1]

    @jax.jit
    def decode(state, token, mems):
        model = nnx.merge(graphdef, state)

        def step(carry, _):
            token, mems = carry
            logits, mems = model(token[:, None], mems)
            return (jnp.argmax(logits[:, -1], axis=-1), mems), None

        return jax.lax.scan(step, (token, mems), length=GENERATED)[0][0]

    prompt = jax.random.randint(jax.random.key(1), (batch, mem), 0, VOCAB)
    mems = prefill(state, prompt, model.init_mems(batch, mem, keys_values=keys_values))
    return _timer(lambda: jax.block_until_ready(decode(state, prompt[:, -1], mems)))


def main() -> None:
    parser = options.parser(__doc__)
    parser.add_argument("--scheme", default="txl", choices=POSITIONS)
    options.add_size(parser)
    parser.add_argument("--dtype", default="float32", choices=options.DTYPES)
    parser.add_argument("--settings", default="128:128,80:2100,128:1024", help="T:M pairs")
    parser.add_argument("--generate", type=int, default=1024, help="memory length; 0: skip")
    options.add_timing(parser, rounds=5)
    args = parser.parse_args()
    from relpos_jax.ops import host_memory

    host_memory.reuse_freed_memory()  # what eval.py does; before the first computation
    size = SIZES[args.size]
    model = our_model(args.scheme, size, dtype=args.dtype)
    batch = size["batch"]
    cases = []  # (what, T, M, tokens per call, {memory kind: timer})
    for setting in args.settings.split(","):
        seg, mem = (int(x) for x in setting.split(":"))
        timers = {kv: evaluation(model, batch, seg, mem, kv) for kv in (False, True)}
        cases.append(("evaluation", seg, mem, batch * seg, timers))
    if args.generate:
        timers = {kv: generation(model, batch, args.generate, kv) for kv in (False, True)}
        cases.append(("generation", 1, args.generate, batch * GENERATED, timers))

    rates = [{False: [], True: []} for _ in cases]
    for _ in range(args.rounds):
        for (_, _, _, tokens, timers), rate in zip(cases, rates, strict=True):
            for kv, seconds in timers.items():
                rate[kv].append(tokens / seconds())

    print(f"{args.scheme}, {args.size} sizes (batch {batch}), {args.dtype}, {args.rounds} rounds")
    print(
        "| task | segment T | memory M | hidden states tok/s | keys and values tok/s | speed-up |"
    )
    print("|---|---:|---:|---:|---:|---:|")
    for (what, seg, mem, _, _), rate in zip(cases, rates, strict=True):
        states, kv = statistics.median(rate[False]), statistics.median(rate[True])
        print(f"| {what} | {seg} | {mem} | {states:,.0f} | {kv:,.0f} | {kv / states:.2f}x |")


if __name__ == "__main__":
    main()
