"""One attention layer, forward and backward: the Pallas kernels against the tiled and dense paths
and cuDNN's fused attention, side by side on one accelerator.

    python -m bench.fused_attention [--schemes txl,rope,alibi,t5,shaw] [--lengths 1024,...,32768]
        [--dtype bfloat16] [--out docs/benchmarks]

One layer of the large size (d_model 1024, 16 heads of 64), batch 1, a segment of T queries and no
memory (``--memory`` adds one), causal: the shapes cuDNN's ``jax.nn.dot_product_attention`` takes.
Each cell is one program, compiled in a process of its own (``measure.isolated``): the gradient of
the layer's output (projections, position terms, attention) with respect to its input and
parameters, timed as the median of ``--repeats`` calls after ``--warmup``. The ``cudnn`` column
runs ``jax.nn.dot_product_attention`` (``implementation="cudnn"``; XLA's on a CPU) on the same
projections where the scheme fits it: RoPE (rotation, then the fused kernel) and ALiBi (a
precomputed ``[N, T, K]`` bias, up to ``--max-bias-gib``). *TFLOP/s* counts the attention core,
causal: 2·2·N·H·T·K/2 forward, 2.5 times that backward (FlashAttention-2's count). ``compute`` also
takes other sizes and batches (``size``, ``batch`` in its spec): ``bench.gpu``'s attention table.

Writes ``fused_attention.json`` (settings, every cell) in ``--out`` and renders
``fused_attention.md`` from it, with the target: the txl kernel at T = 8k within 1.5× of cuDNN with
RoPE. On a CPU the kernels run in Pallas' interpreter (a smoke test, not a speed).
"""

from __future__ import annotations

import datetime
import json
import pathlib

from bench import args as bench_args
from bench.measure import SIZES, commit, isolated, median_seconds, our_model, parse_or_serve

IMPLS = ("kernel", "tiled", "dense", "cudnn")
CUDNN_SCHEMES = ("rope", "alibi")


def _size(spec: dict) -> dict:
    """The layer's sizes: ``spec["size"]``, a ``SIZES`` name or a dict of its fields (default large)."""
    size = spec.get("size", "large")
    return SIZES[size] if isinstance(size, str) else size


def _layer(spec: dict):
    """The layer of a one-layer model, its input and window, and the forward's position context."""
    import jax
    import jax.numpy as jnp

    size = dict(_size(spec), layers=1, mem=spec["memory"])
    batch = spec.get("batch", 1)
    impl = "dense" if spec["impl"] == "cudnn" else spec["impl"]
    model = our_model(spec["scheme"], size, attention_impl=impl, dtype=spec["dtype"])
    mems = model.init_mems(batch)._replace(valid=jnp.asarray(spec["memory"], jnp.int32))
    ctx = model._position_context(mems, spec["length"], 0, None, True)
    dtype = jnp.dtype(spec["dtype"])
    x = jax.random.normal(jax.random.key(0), (batch, spec["length"], size["d_model"]), dtype)
    window = jnp.concatenate([jnp.zeros((batch, spec["memory"], size["d_model"]), dtype), x], 1)
    return model.layer(0).attention, x, window, ctx


def _cudnn(attention, x, window, ctx, spec):
    """The layer with cuDNN's fused attention between the same projections."""
    import jax
    import jax.numpy as jnp

    from relpos_jax.ops import precision

    q, k, v = attention._project(x, window, ctx)
    if attention.kv_layout == "bnhk":  # a CPU's layout: [B, N, H, K] -> [B, K, N, H]
        k, v = k.transpose(0, 3, 1, 2), v.transpose(0, 3, 1, 2)
    bias = None
    if spec["scheme"] == "alibi":
        bias = attention.scheme.bias(attention, ctx.tile(), None)[None].astype(q.dtype)
    on_gpu = jax.default_backend() == "gpu"
    out = jax.nn.dot_product_attention(
        q, k, v, bias=bias, is_causal=True, scale=attention.scale,
        implementation="cudnn" if on_gpu else None,
    )  # fmt: skip
    return precision.einsum("bqnh,nhd->bqd", out, attention.w_o[...].astype(jnp.dtype(q.dtype)))


def compute(spec: dict) -> dict:
    import jax
    from flax import nnx

    attention, x, window, ctx = _layer(spec)
    graphdef, params, rest = nnx.split(attention, nnx.Param, ...)  # differentiate the parameters

    def loss(params, x, window):
        layer = nnx.merge(graphdef, params, rest)
        if spec["impl"] == "cudnn":
            return _cudnn(layer, x, window, ctx, spec).astype(float).sum()
        return layer(x, window, ctx, deterministic=True).astype(float).sum()

    step = jax.jit(jax.grad(loss, argnums=(0, 1, 2)))
    compiled = step.lower(params, x, window).compile()
    call = lambda: jax.block_until_ready(compiled(params, x, window))  # noqa: E731
    seconds = median_seconds(call, spec["repeats"], spec["warmup"])
    size = _size(spec)
    keys = spec["length"] + spec["memory"]
    flops = spec.get("batch", 1) * (
        3.5 * 2 * 2 * size["heads"] * (size["d_model"] // size["heads"]) * spec["length"] * keys / 2
    )
    return {
        "seconds": seconds, "tflops": flops / seconds / 1e12,
        "device": jax.devices()[0].device_kind, "interpreted": jax.default_backend() == "cpu",
    }  # fmt: skip


def render(results: dict) -> str:
    s = results["settings"]
    lines = [
        "# Fused relative attention: one layer, forward and backward",
        "",
        f"Command: `{s['command']}`  ",
        f"Machine: {s['device']}; jax {s['jax']}; commit {s['commit']}; {s['date']}.",
        "",
        f"One layer of d_model 1024 (16 heads of 64), batch 1, memory {s['memory']}, {s['dtype']}; "
        "milliseconds of the gradient step (median); the kernels' tokens/s (queries a second) and the "
        "attention core's TFLOP/s.",
        "",
        "| scheme | T | " + " | ".join(f"{impl} ms" for impl in IMPLS) + " | kernel tokens/s | "
        "kernel TFLOP/s | kernel / cudnn (rope) |",
        "|---|---:|" + "---:|" * (len(IMPLS) + 3),
    ]
    cells = {(c["scheme"], c["length"], c["impl"]): c for c in results["cells"]}
    for scheme in s["schemes"]:
        for length in s["lengths"]:
            row = [scheme, f"{length:,}"]
            for impl in IMPLS:
                c = cells.get((scheme, length, impl))
                row.append(_ms(c))
            kernel = cells.get((scheme, length, "kernel"))
            timed = kernel and "seconds" in kernel
            row.append(f"{length / kernel['seconds']:,.0f}" if timed else "")
            row.append(f"{kernel['tflops']:.1f}" if timed else "")
            rope = cells.get(("rope", length, "cudnn"))
            both = kernel and rope and "seconds" in kernel and "seconds" in rope
            row.append(f"{kernel['seconds'] / rope['seconds']:.2f}" if both else "")
            lines.append("| " + " | ".join(row) + " |")
    lines += ["", "Target: the txl kernel at T = 8,192 within 1.5× of cuDNN with RoPE."]
    return "\n".join(lines) + "\n"


def _ms(cell: dict | None) -> str:
    if cell is None:
        return ""
    if "error" in cell:
        return f"error: {cell['error']}"
    return f"{1e3 * cell['seconds']:,.1f}"


def main() -> None:
    parser = bench_args.parser(__doc__)
    bench_args.add_schemes(parser, ("txl", "rope", "alibi", "t5", "shaw"))
    parser.add_argument(
        "--lengths", type=bench_args.ints, default="1024,2048,4096,8192,16384,32768"
    )
    parser.add_argument("--impls", type=bench_args.listed(choices=IMPLS), default=",".join(IMPLS))
    parser.add_argument("--memory", type=int, default=0, help="memory slots before the segment")
    parser.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float32"))
    parser.add_argument("--dense-up-to", type=int, default=16384, help="longest T for dense")
    parser.add_argument("--max-bias-gib", type=float, default=8.0, help="cudnn's ALiBi bias")
    bench_args.add_timing(parser, repeats=10, warmup=3)
    bench_args.add_out(parser)
    args = parse_or_serve(parser, compute)
    if args is None:
        return
    import sys

    import jax

    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = {
        "settings": {
            "command": "python -m bench.fused_attention " + " ".join(sys.argv[1:]),
            "device": jax.devices()[0].device_kind,
            "jax": jax.__version__,
            "commit": commit(),
            "date": datetime.date.today().isoformat(),
            "schemes": list(args.schemes),
            "lengths": list(args.lengths),
            "memory": args.memory,
            "dtype": args.dtype,
        },
        "cells": [],
    }
    for scheme in args.schemes:
        for length in args.lengths:
            for impl in args.impls:
                if impl == "cudnn" and scheme not in CUDNN_SCHEMES:
                    continue
                bias_gib = 16 * length * (length + args.memory) * 2 / 2**30
                if impl == "dense" and length > args.dense_up_to:
                    continue
                if impl == "cudnn" and scheme == "alibi" and bias_gib > args.max_bias_gib:
                    continue
                spec = dict(scheme=scheme, length=length, impl=impl, memory=args.memory,
                            dtype=args.dtype, repeats=args.repeats, warmup=args.warmup)  # fmt: skip
                cell = {**spec, **isolated("bench.fused_attention", spec)}
                results["cells"].append(cell)
                print(f"{scheme} T={length} {impl}: {_ms(cell)} ms", flush=True)
                (out / "fused_attention.json").write_text(json.dumps(results, indent=1) + "\n")
                (out / "fused_attention.md").write_text(render(results))


if __name__ == "__main__":
    main()
