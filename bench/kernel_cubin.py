"""What each Triton kernel needs of an H100/H200 (sm_90) and an A100 (sm_80), compiled without a
GPU: ``docs/benchmarks/kernel_cubin.{json,md}``.

    python -m bench.kernel_cubin [--out docs/benchmarks]   (the cubin extra: make test-cubin's venv)

Every scheme's forward and backward kernels (``kernel.cubin.TERMS``), head dim 64 and 128, bf16 and
float32, compiled twice: as first launched (block 64, 4 warps, 2 pipeline stages, the launch an H200
refused) and as ``kernel.fit`` launches them on that chip. The markdown is rendered from the JSON.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import pathlib
import time

from bench import args as bench_args
from bench.measure import commit, machine

HEAD_DIMS, DTYPES, ARCHS = (64, 128), ("bfloat16", "float32"), (90, 80)
CHIPS = {90: "NVIDIA H200", 80: "NVIDIA A100-SXM4-80GB"}
FIRST = {"block": 64, "num_warps": 4, "num_stages": 2}  # the launch before kernel.fit


def measure(scheme: str, head_dim: int, dtype: str, arch: int) -> list[dict]:
    """Both launches of the scheme's two kernels on ``arch``."""
    import jax.numpy as jnp

    from relpos_jax.attention.kernel import cubin, fit
    from relpos_jax.ops import backend

    terms = cubin.TERMS[scheme]
    block = fit.block(terms, head_dim, jnp.dtype(dtype).itemsize, arch)
    first = cubin.attention(scheme, head_dim, getattr(jnp, dtype), block=FIRST["block"])
    with backend.target("gpu", CHIPS[arch]):
        now = cubin.attention(scheme, head_dim, getattr(jnp, dtype))
    rows = []
    for launch, kernels, options in (("first", first, FIRST), ("fit", now, {"block": block})):
        for direction, lowered in zip(("forward", "backward"), kernels, strict=True):
            warps, stages = options.get("num_warps"), options.get("num_stages")
            compiled = cubin.compile_kernel(lowered, arch, warps, stages)
            rows.append({
                "scheme": scheme, "head_dim": head_dim, "dtype": dtype, "arch": arch,
                "launch": launch, "direction": direction, "block": options["block"],
                "num_warps": compiled.num_warps, "num_stages": compiled.num_stages,
                "shared": compiled.shared, "registers": compiled.registers,
                "spilled": compiled.spilled, "early_reads": compiled.early_reads,
                "seconds": round(compiled.seconds, 2), "problems": compiled.problems(),
            })  # fmt: skip
    return rows


def render(results: dict) -> str:
    lines = [
        "# The Triton kernels compiled for Hopper and Ampere, without a GPU",
        "",
        f"Written by `{results['command']}` from `kernel_cubin.json`: every kernel lowered by "
        f"Pallas (jax {results['jax']}) and compiled to cubin by the triton {results['triton']} "
        f"wheel's compiler and ptxas, on {results['machine']}, at commit {results['commit']}, "
        f"{results['date']}. Segment 512 + memory 512. A cell: shared memory a block (KiB) · "
        "registers · bytes spilled a thread · scratch reads pipelined ahead of their store; "
        "**bold** where it would not run as it should (shared memory over the chip's 227 KiB on "
        "sm_90, 163 KiB on sm_80; spills over 2 KiB; any early read). *first*: these kernels "
        "launched as they first were, block 64, 4 warps, 2 stages (the launch an H200 refused; "
        "FIRE's hidden units already a loop); *fit*: `kernel.fit`'s launch for that chip (its "
        "block in the column). These are compiles, not runs: whether the kernels are right and "
        "fast on a GPU is measured by `bench/gpu.sh` there.",
        "",
        "| scheme | head dim | dtype | chip | direction | first | fit (block) |",
        "|---|---:|---|---|---|---|---|",
    ]
    rows = results["rows"]
    keys = sorted({(r["scheme"], r["head_dim"], r["dtype"], r["arch"], r["direction"])
                   for r in rows}, key=lambda k: (k[0], k[1], k[2], -k[3], k[4] != "forward"))  # fmt: skip
    for key in keys:
        pair = {r["launch"]: r for r in rows
                if (r["scheme"], r["head_dim"], r["dtype"], r["arch"], r["direction"]) == key}  # fmt: skip
        scheme, head_dim, dtype, arch, direction = key
        lines.append(
            f"| {scheme} | {head_dim} | {dtype} | sm_{arch} | {direction} | {_cell(pair['first'])} | "
            f"{_cell(pair['fit'])} ({pair['fit']['block']}) |"
        )
    bad = [sum(bool(r["problems"]) for r in rows if r["launch"] == k) for k in ("first", "fit")]
    lines += [
        "",
        f"Kernels that would not run as they should: first {bad[0]} of {len(rows) // 2}, "
        f"fit {bad[1]} of {len(rows) // 2}.",
    ]
    return "\n".join(lines) + "\n"


def _cell(row: dict) -> str:
    text = (f"{row['shared'] / 1024:.0f} · {row['registers']} · {row['spilled']:,} · "
            f"{row['early_reads']}")  # fmt: skip
    return f"**{text}**" if row["problems"] else text


def main() -> None:
    parser = bench_args.parser(__doc__)
    bench_args.add_out(parser)
    options = parser.parse_args()
    import jax

    from relpos_jax.attention.kernel import cubin

    start = time.perf_counter()
    rows = []
    for scheme in cubin.TERMS:
        for head_dim in HEAD_DIMS:
            for dtype in DTYPES:
                for arch in ARCHS:
                    print(f"{scheme} {head_dim} {dtype} sm_{arch} …", flush=True)
                    rows += measure(scheme, head_dim, dtype, arch)
    results = {
        "command": "python -m bench.kernel_cubin", "commit": commit(), "machine": machine(),
        "date": datetime.date.today().isoformat(), "jax": jax.__version__,
        "triton": importlib.metadata.version("triton"), "seconds": time.perf_counter() - start,
        "rows": rows,
    }  # fmt: skip
    out = pathlib.Path(options.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernel_cubin.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "kernel_cubin.md").write_text(render(results))
    print(f"wrote {out / 'kernel_cubin.json'} and .md in {results['seconds'] / 60:.1f} min")


if __name__ == "__main__":
    main()
