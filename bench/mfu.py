"""Model FLOPs utilisation of relpos_jax training: tokens/s × FLOPs per token over the device's peak.

    python -m bench.mfu [--size base,large] [--dtypes bfloat16,float32] [--repeats 10]
        [--attention-impl dense|tiled|kernel|auto]

For each ``--size`` and dtype, times ``speed.ours("train", "txl", ...)`` (forward, backward, Adam,
memory carried) and reports tokens/s, achieved model TFLOP/s (``model_flops`` per token × tokens/s)
and MFU against the dense peak of the device (``PEAK_TFLOPS``; blank when the device is not listed).
"""

from __future__ import annotations

from bench import args as options
from bench.measure import SIZES, VOCAB, isolated, parse_or_serve

PEAK_TFLOPS = {  # dense bf16 / fp32 (non-tensor-core) peaks from the vendors' data sheets
    "H200": {"bfloat16": 989.0, "float32": 67.0},
    "H100": {"bfloat16": 989.0, "float32": 67.0},
    "A100": {"bfloat16": 312.0, "float32": 19.5},
    "TPU v5 lite": {"bfloat16": 197.0, "float32": 197.0},
    "TPU v4": {"bfloat16": 275.0, "float32": 275.0},
}


def model_flops(size: dict, scheme: str = "txl", output: float | None = None) -> float:
    """Training FLOPs per token: 3 × the forward matrix products (backward = 2 × forward).

    Per layer and segment token, forward: queries and output 2·2·D², keys and values over the whole
    window 2·2·D²·K/T (memory rows included), feed-forward 2·2·D·F, attention scores and values
    2·2·K·D, and for Transformer-XL the position scores 2·K·D; plus the output layer, ``output``
    forward FLOPs a token (default 2·D·V over the bytes).
    """
    d, f, t = size["d_model"], size["d_ff"], size["seg"]
    k = t + size["mem"]
    layer = 4 * d * d + 4 * d * d * k / t + 4 * d * f + 4 * k * d
    if scheme == "txl":
        layer += 2 * k * d
    return 3 * (size["layers"] * layer + (2 * d * VOCAB if output is None else output))


def output_flops(model) -> float:
    """Forward FLOPs a token of a config's output layer: 2·D·V, or with an adaptive softmax
    (``relpos_jax.adaptive``, every cluster scored for every token) 2 × its projections and tables."""
    d, bounds = model.d_model, (0, *model.cutoffs, model.vocab_size)
    d_embed = model.d_embed or d
    clusters = len(bounds) - 1
    projected = model.div_val > 1 or d_embed != d
    flops = 0.0
    for i in range(clusters):
        width = d_embed // model.div_val**i
        rows = bounds[i + 1] - bounds[i] + (clusters - 1 if i == 0 else 0)
        flops += 2 * width * rows + (2 * d * width if projected else 0)
    return flops


def step_flops(config) -> float:
    """Training FLOPs of one optimizer step of a config (``model_flops`` × its tokens)."""
    m, d = config.model, config.data
    size = dict(layers=m.n_layers, d_model=m.d_model, d_ff=m.d_ff, seg=d.segment_len, mem=m.mem_len)
    return model_flops(size, m.position, output_flops(m)) * d.batch_size * d.segment_len


def mfu(spec: dict) -> dict:
    import jax

    from bench.speed import ours

    size, dtype = SIZES[spec["size"]], spec["dtype"]
    tokens_per_sec = ours(
        "train", "txl", dtype, size, spec["repeats"], spec["warmup"], remat=spec["remat"],
        attention_impl=spec.get("attention_impl", "dense"),
    )  # fmt: skip
    achieved = tokens_per_sec * model_flops(size) / 1e12
    device = jax.devices()[0]
    peak = next((p[dtype] for name, p in PEAK_TFLOPS.items() if name in device.device_kind), None)
    memory = device.memory_stats() or {}  # None on CPU
    return {
        "device": device.device_kind,
        "tokens_per_sec": tokens_per_sec,
        "tflops": achieved,
        "mfu": achieved / peak if peak else None,
        "device_peak_mib": memory.get("peak_bytes_in_use", 0) / 2**20 or None,
    }


def main() -> None:
    parser = options.parser(__doc__)
    options.add_size(parser, "base,large", many=True)
    options.add_dtypes(parser, "bfloat16,float32")
    options.add_timing(parser, repeats=10, warmup=3)
    parser.add_argument("--remat", action="store_true", help="model.remat: recompute each layer")
    parser.add_argument(
        "--attention-impl", default="dense", choices=("dense", "tiled", "kernel", "auto"),
        help="model.attention_impl (kernel: the Pallas kernels)",
    )  # fmt: skip
    args = parse_or_serve(parser, mfu)
    if args is None:
        return
    print(
        "| size | dtype | attention | remat | device | tokens/s | model TFLOP/s | MFU "
        "| device peak MiB |"
    )
    print("|---|---|---|---|---|---:|---:|---:|---:|")
    for size in args.size:
        for dtype in args.dtypes:
            spec = dict(
                size=size, dtype=dtype, repeats=args.repeats, warmup=args.warmup, remat=args.remat,
                attention_impl=args.attention_impl,
            )  # fmt: skip
            r = isolated("bench.mfu", spec)
            if "error" in r:
                print(
                    f"| {size} | {dtype} | {args.attention_impl} | {args.remat} | "
                    f"error: {r['error']} | | | | |"
                )
                continue
            share = "" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
            memory = "" if r["device_peak_mib"] is None else f"{r['device_peak_mib']:,.0f}"
            print(
                f"| {size} | {dtype} | {args.attention_impl} | {args.remat} | {r['device']} | "
                f"{r['tokens_per_sec']:,.0f} | "
                f"{r['tflops']:.1f} | {share} | {memory} |",
                flush=True,
            )


if __name__ == "__main__":
    main()
