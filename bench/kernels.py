"""The matrix products of a txl_small step: XLA:CPU (what relpos_jax runs) against PyTorch, in one run.

    .venv/bin/python -m bench.kernels [--dtypes bfloat16,float32] [--repeats 30]

The PyTorch column needs the ``bench`` extra (CPU PyTorch); without it, it says so. Each row is one product shape of a txl_small training step
(B 16, T 128, K 256, N 4 heads of 64, D 256, F 1024): the plain products of the projections and
the feed-forward layer, and the batched products of attention (one per batch row and head). JAX runs
``jnp.einsum`` with float32 accumulation (bf16 operands, f32 result: ``preferred_element_type``, what
the model's products do); PyTorch runs ``torch.matmul`` / ``torch.bmm`` (bf16 result, as under
autocast). GFLOP/s is the median of ``--repeats`` calls after 5. The two libraries run alternately in
this process, so the ratio is measured on the same machine at the same time.
"""

from __future__ import annotations

from bench import args as options
from bench.measure import median_seconds

# (label, batch, rows, contracted, columns); batch 0 = a plain 2-D product
SHAPES = [
    ("feed-forward up [BT, D] x [D, F]", 0, 2048, 256, 1024),
    ("feed-forward down [BT, F] x [F, D]", 0, 2048, 1024, 256),
    ("key/value projection [BK, D] x [D, 2D]", 0, 4096, 256, 512),
    ("weight gradient [F, BT] x [BT, D]", 0, 1024, 2048, 256),
    ("content logits q·k per (b, n)", 64, 128, 64, 256),
    ("weights·v per (b, n)", 64, 128, 256, 64),
    ("key gradient per (b, n)", 64, 64, 128, 256),
    ("Transformer-XL position term per head", 4, 2048, 64, 256),
]


def jax_product(batch, rows, depth, columns, dtype):
    import jax
    import jax.numpy as jnp

    lead = (batch,) if batch else ()
    a = jnp.ones((*lead, rows, depth), dtype)
    b = jnp.ones((*lead, depth, columns), dtype)
    spec = "gik,gkj->gij" if batch else "ik,kj->ij"
    product = jax.jit(lambda a, b: jnp.einsum(spec, a, b, preferred_element_type=jnp.float32))
    return lambda: jax.block_until_ready(product(a, b))


def torch_product(batch, rows, depth, columns, dtype):
    import torch

    lead = (batch,) if batch else ()
    a = torch.ones(*lead, rows, depth, dtype=dtype)
    b = torch.ones(*lead, depth, columns, dtype=dtype)
    return lambda: torch.matmul(a, b)


def main() -> None:
    parser = options.parser(__doc__)
    options.add_dtypes(parser, "bfloat16,float32")
    options.add_timing(parser, repeats=30)
    args = parser.parse_args()

    import jax.numpy as jnp

    from relpos_jax.ops import host_memory

    host_memory.reuse_freed_memory()
    try:
        import torch
    except ImportError:
        torch = None
    peer = (
        f"PyTorch {torch.__version__}, {torch.get_num_threads()} threads"
        if torch
        else ("PyTorch not installed (pip install -e .[bench])")
    )
    print(f"GFLOP/s, median of {args.repeats}; {peer}\n")
    print("| dtype | product | shape (batch × rows × contracted × columns) | XLA:CPU | PyTorch "
          "| XLA / PyTorch |")  # fmt: skip
    print("|---|---|---|---:|---:|---:|")
    for dtype in args.dtypes:
        for label, batch, rows, depth, columns in SHAPES:
            flops = 2 * max(batch, 1) * rows * depth * columns
            ours_call = jax_product(batch, rows, depth, columns, jnp.dtype(dtype))
            ours = flops / median_seconds(ours_call, args.repeats, 5) / 1e9
            shape = f"{batch or 1} × {rows} × {depth} × {columns}"
            if torch is None:
                print(f"| {dtype} | {label} | {shape} | {ours:,.0f} | — | |", flush=True)
                continue
            theirs_call = torch_product(batch, rows, depth, columns, getattr(torch, dtype))
            theirs = flops / median_seconds(theirs_call, args.repeats, 5) / 1e9
            print(
                f"| {dtype} | {label} | {shape} | {ours:,.0f} | {theirs:,.0f} | "
                f"{ours / theirs:.2f}x |",
                flush=True,
            )


if __name__ == "__main__":
    main()
