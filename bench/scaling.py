"""Scaling with segment length: training-step time and XLA temporary memory, every scheme.

    .venv/bin/python -m bench.scaling [--lengths 128,256,512,1024,2048] [--schemes txl,shaw,...]

For each scheme and length T (segment = memory = T, batch 1, txl_small's other sizes), compiles one
training step (forward and backward) and reports its median time and XLA's temporary buffer size —
the number that shows whether a position term stays O(T·H) beyond the attention matrix itself.
"""

from __future__ import annotations

from bench import args as options
from bench.measure import SIZES, VOCAB, isolated, median_seconds, our_model, parse_or_serve


def scaling(spec: dict) -> dict:
    """Train-step seconds and XLA temporary MiB at segment = memory = ``length``, batch 1."""
    import jax
    import optax
    from flax import nnx

    length = spec["length"]
    model = our_model(
        spec["scheme"], SIZES[spec["size"]], mem_len=length, learned={"max_len": 2 * length}
    )
    data = jax.random.randint(jax.random.key(0), (1, length + 1), 0, VOCAB)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    mems = model.init_mems(1)

    def loss(params, rest, mems):
        logits, _ = nnx.merge(graphdef, params, rest)(data[:, :-1], mems)
        return optax.softmax_cross_entropy_with_integer_labels(logits, data[:, 1:]).mean()

    compiled = jax.jit(jax.grad(loss)).lower(params, rest, mems).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes / 2**20
    seconds = median_seconds(
        lambda: jax.block_until_ready(compiled(params, rest, mems)), spec["repeats"], 1
    )
    return {"seconds": seconds, "temp_mib": temp}


def main() -> None:
    parser = options.parser(__doc__)
    parser.add_argument("--lengths", type=options.ints, default="128,256,512,1024,2048")
    options.add_schemes(parser)
    options.add_size(parser)
    options.add_timing(parser, repeats=3)
    args = parse_or_serve(parser, scaling)
    if args is None:
        return
    lengths = args.lengths
    print("train step (forward + backward), batch 1, memory = segment; ms / XLA temp MiB\n")
    print("| scheme | " + " | ".join(f"T={n}" for n in lengths) + " |")
    print("|---|" + "---:|" * len(lengths))
    for scheme in args.schemes:
        cells = []
        for length in lengths:
            spec = dict(scheme=scheme, length=length, repeats=args.repeats, size=args.size)
            r = isolated("bench.scaling", spec)
            cells.append(r.get("error", f"{1000 * r['seconds']:,.0f} / {r['temp_mib']:,.0f}"))
        print(f"| {scheme} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
