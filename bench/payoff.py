"""The memory payoff (Transformer-XL paper, Table 9): evaluation with memory against recomputation.

    .venv/bin/python -m bench.payoff [--contexts 256,512,1024,2048] [--size small] [--repeats 2]

For each context C, the same relpos_jax Transformer-XL model and weights evaluate tokens two ways:
with memory (segments and memory both C long, as in the paper's evaluation; best of ``--repeats``
passes), and as a vanilla model that recomputes its whole C-token window for every token (sliding
window, stride 1). Prints tokens/s of both and the speed-up as a markdown table.
"""

from __future__ import annotations

from bench import args as options
from bench.measure import SIZES, VOCAB, isolated, our_model, parse_or_serve


def stride_one_rate(model, stream, batch: int, context: int, windows: int) -> float:
    """Windows per second of ``evaluate_sliding(stride=1)``: the vanilla model's tokens/s, each scored
    token with its whole context recomputed (``windows`` a multiple of ``batch``: no padded window)."""
    from relpos_jax.evaluate import evaluate_sliding

    result = evaluate_sliding(
        model, stream, batch_size=batch, window=context, stride=1, max_tokens=context + windows - 1
    )
    assert result["tokens"] == context + windows - 1  # the first window's C, then one per window
    return windows / (result["tokens"] / result["tokens_per_sec"])


def payoff(spec: dict) -> dict:
    """Evaluation tokens/s with memory and with stride-1 recomputation, same model, context C."""
    import numpy as np

    from relpos_jax.data import ArrayStream
    from relpos_jax.evaluate import evaluate

    context, repeats, size = spec["context"], spec["repeats"], SIZES[spec["size"]]
    model = our_model("txl", size, mem_len=context)
    batch, seg = size["batch"], context  # segments as long as the memory, as in the paper's eval
    tokens = np.random.default_rng(0).integers(0, VOCAB, 1 << 20).astype(np.int32)
    stream = ArrayStream(tokens)
    xl_tokens = batch * seg * 4  # four segments: the memory is full from the second on
    # each pass once untimed first: ``evaluate`` compiles for its block of segments' shape
    evaluate(
        model, stream, batch_size=batch, segment_len=seg, mem_len=context, max_tokens=xl_tokens
    )
    xl = max(
        evaluate(
            model, stream, batch_size=batch, segment_len=seg, mem_len=context, max_tokens=xl_tokens
        )["tokens_per_sec"]
        for _ in range(repeats)
    )
    # vanilla: every scored token recomputes its window. The first window of evaluate_sliding scores
    # all its C targets at the cost of one pass; only the windows count here: one token each.
    windows = batch * 4
    stride_one_rate(model, stream, batch, context, windows)
    vanilla = max(stride_one_rate(model, stream, batch, context, windows) for _ in range(repeats))
    return {"context": context, "memory_tok_s": xl, "vanilla_tok_s": vanilla}


def main() -> None:
    parser = options.parser(__doc__)
    parser.add_argument("--contexts", type=options.ints, default="256,512,1024,2048")
    options.add_size(parser)
    options.add_timing(parser, repeats=2)
    args = parse_or_serve(parser, payoff)
    if args is None:
        return
    print("| context | with memory tok/s | vanilla (stride 1) tok/s | speed-up |")
    print("|---:|---:|---:|---:|")
    for context in args.contexts:
        r = isolated("bench.payoff", dict(context=context, repeats=args.repeats, size=args.size))
        if "error" in r:
            print(f"| {context} | error: {r['error']} | | |", flush=True)
            continue
        speedup = r["memory_tok_s"] / r["vanilla_tok_s"]
        print(
            f"| {context} | {r['memory_tok_s']:,.0f} | {r['vanilla_tok_s']:,.1f} | "
            f"{speedup:,.0f}x |",
            flush=True,
        )


if __name__ == "__main__":
    main()
