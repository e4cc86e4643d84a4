"""The accelerator benchmark, one table a process (``bash bench/gpu.sh [--quick]`` runs them all).

    python -m bench.gpu --table training|depth|attention|profile --json PATH [--quick] [--rows N]
    python -m bench.gpu --record TABLE --outcome TEXT --json PATH     # what gpu.sh saw of a table

Each table measures in this process and merges its rows into the JSON at ``--json`` after every
row (device, jax/jaxlib/flax versions, commit, date UTC, command; each row with its settings), so a
table stopped by gpu.sh's time limit keeps the rows it finished; ``python -m bench.gpu_render``
writes the markdown from that JSON. The persistent compilation cache is on (``JAX_COMPILATION_CACHE_DIR``,
default /tmp/jax_cache): a program that another table compiled loads from it, and each compile
records whether it did (``cache_hit``), so that no cached load reads as a compile time.

* ``training``: ``relpos_jax.train_step``'s jitted step as ``train.py`` runs it (``bench.gpu_step``:
  configs/txl_base_enwik8.py, dropout 0.1, Adam, clipping, memory carried), bf16: txl_base_enwik8's sizes (12 layers, d_model 512,
  segment and memory 512, batch 22) dense, tiled and through the kernels; 24 layers of d_model 1024
  (d_ff 4096, 16 heads, batch 16) dense and with ``model.remat``; then the base step without
  dropout, RoPE's at base sizes dense and through the kernels (what the TXL terms cost), and the
  base step with its layers unrolled (``model.scan_unroll``). Lower + compile seconds, the step's
  median time over synchronised steps after warm-up (tokens/s, model TFLOP/s, MFU from it), the mean
  of the same number of pipelined steps (as train.py's loop runs them), XLA's memory for the program.
* ``depth``: lower + compile seconds of that step at 12, 24 and 48 layers (d_model 512).
* ``attention``: one layer forward and backward (``bench.fused_attention.compute``), d_model 512
  (8 heads of 64), causal, no memory, B·T = 16k tokens at T = 1k, 4k, 8k: txl and rope through
  the dense, tiled and kernel paths, and cuDNN's ``jax.nn.dot_product_attention`` on rope's projections;
  then the kernels of t5, alibi, kerple, shaw and fire, and alibi through cuDNN, at the longest T.
* ``profile``: the base step under ``jax.profiler.trace``, its device time by kind of kernel and
  by phase (``bench.gpu_profile``).
* ``kernels`` (``bash bench/gpu.sh --kernels``): the attention layer of ``attention`` over lengths
  and memories, T = 1k … 32k, memory 0, 512 and 4,096: txl through the kernels and the tiled path,
  rope through the kernels and (no memory: its causal mask assumes none) cuDNN; B·T fixed. The
  cells at T = 8k first, then the other lengths, so that a table stopped early keeps them.

``--quick`` checks that everything compiles and runs: fewer rows and steps at small sizes; on a CPU
every table runs at ``SIZES["tiny"]`` (the Pallas kernels interpreted, MFU blank, cuDNN skipped).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import pathlib
import statistics
import sys
import time

from bench.gpu_step import Step, enable_cache, run_steps
from bench.measure import SIZES, commit

TABLES = ("training", "depth", "attention", "profile", "kernels")
QUICK_GPU = dict(layers=2, d_model=256, heads=4, d_ff=1024, seg=256, mem=256, batch=8)
ATTENTION = dict(layers=1, d_model=512, heads=8, d_ff=2048, seg=0, mem=0, batch=1)
TOKENS = 16384  # B·T of the attention table
SCHEMES_LATE = ("t5", "alibi", "kerple", "shaw", "fire")  # the attention table's last rows


def on_cpu() -> bool:
    import jax

    return jax.default_backend() == "cpu"


def quick_size() -> dict:
    return dict(SIZES["tiny"]) if on_cpu() else dict(QUICK_GPU)


def peak_tflops(dtype: str = "bfloat16") -> float | None:
    """The device's dense peak (``bench.mfu.PEAK_TFLOPS``); None where it is not listed (a CPU)."""
    import jax

    from bench.mfu import PEAK_TFLOPS

    kind = jax.devices()[0].device_kind
    return next((p[dtype] for name, p in PEAK_TFLOPS.items() if name in kind), None)


def training_rows(quick: bool) -> list[dict]:
    if quick:
        q = quick_size()
        return [
            dict(name="quick", size=q, impl=impl, remat=remat)
            for impl, remat in (("dense", False), ("kernel", False), ("dense", True), ("tiled", False))
        ]  # fmt: skip
    base, large = SIZES["base"], SIZES["large"]
    return [  # the targets' rows first (a table stopped at its time limit keeps them), the kernels late
        dict(name="base", size=base, impl="dense", remat=False),
        dict(name="large", size=large, impl="dense", remat=False),
        dict(name="large", size=large, impl="dense", remat=True),
        dict(name="base", size=base, impl="kernel", remat=False),
        dict(name="base", size=base, impl="tiled", remat=False),
        # where the base step's time goes, beyond the profile: without its dropout, RoPE's step
        # (no relative shift) densely and through its kernel, and last (the longest compile) its
        # layers unrolled (no loop for XLA to copy around)
        dict(name="base, no dropout", size=base, impl="dense", remat=False,
             overrides=["model.dropout=0.0"]),
        dict(name="base, rope", size=base, impl="dense", remat=False,
             overrides=["model.position=rope"]),
        dict(name="base, rope", size=base, impl="kernel", remat=False,
             overrides=["model.position=rope"]),
        dict(name="base, layers unrolled", size=base, impl="dense", remat=False,
             overrides=[f"model.scan_unroll={base['layers']}"]),
    ]  # fmt: skip


def training_row(spec: dict, quick: bool) -> dict:
    import jax

    from bench.mfu import model_flops

    warmup, repeats = (1, 3) if quick else (3, 10)
    step = Step(
        spec["size"], impl=spec["impl"], remat=spec["remat"], overrides=spec.get("overrides", ())
    )
    compiled, record = step.compile()
    state, batch, mems = step.inputs()
    synced, pipelined, *_ = run_steps(compiled, state, batch, mems, warmup=warmup, repeats=repeats)
    size = spec["size"]
    tokens = size["batch"] * size["seg"]
    median = statistics.median(synced)
    tflops = tokens / median * model_flops(size) / 1e12
    peak = peak_tflops()
    stats = jax.devices()[0].memory_stats() or {}
    return {
        **record, "warmup": warmup, "repeats": repeats, "step_ms": 1e3 * median,
        "step_ms_pipelined": 1e3 * pipelined, "tokens_per_sec": tokens / median,
        "tokens_per_sec_pipelined": tokens / pipelined, "tflops": tflops,
        "mfu": tflops / peak if peak else None,
        "device_peak_gib": stats["peak_bytes_in_use"] / 2**30 if "peak_bytes_in_use" in stats else None,
    }  # fmt: skip


def depth_rows(quick: bool) -> list[dict]:
    if quick:
        q = quick_size()
        return [dict(name=f"{q['layers']} layers", size=q)]
    return [dict(name=f"{n} layers", size={**SIZES["base"], "layers": n}) for n in (12, 24, 48)]


def depth_row(spec: dict, quick: bool) -> dict:
    return Step(spec["size"]).compile()[1]


def attention_rows(quick: bool) -> list[dict]:
    cpu = on_cpu()
    if cpu:
        size, lengths = dict(SIZES["tiny"], layers=1, seg=0, mem=0), (32,)
    else:
        size, lengths = ATTENTION, (1024,) if quick else (1024, 4096, 8192)
    tokens = 2 * lengths[0] if cpu else TOKENS
    groups = (  # the target's cells first, at every length: a table stopped early keeps them
        (("rope", "cudnn"), ("txl", "kernel")),
        (("rope", "kernel"), ("txl", "dense"), ("txl", "tiled")),
        (("rope", "dense"), ("rope", "tiled")),
    )
    cells = [(scheme, impl, length) for group in groups for length in lengths
             for scheme, impl in group]  # fmt: skip
    # then every other scheme the kernels take, at the longest length (the ratios to
    # cuDNN with RoPE are at T = 8k), and ALiBi through cuDNN with its bias
    cells += [(scheme, "kernel", lengths[-1]) for scheme in SCHEMES_LATE]
    cells += [("alibi", "cudnn", lengths[-1])]
    return [
        dict(name=f"{scheme} {impl} T={length}", scheme=scheme, impl=impl, length=length,
             batch=max(1, tokens // length), size=size)
        for scheme, impl, length in cells
    ]  # fmt: skip


def attention_row(spec: dict, quick: bool) -> dict:
    from bench import fused_attention

    if spec["impl"] == "cudnn" and on_cpu():
        return {"outcome": "skipped: cuDNN runs on a GPU only"}
    warmup, repeats = (1, 3) if quick else (3, 10)
    cell = dict(spec, memory=spec.get("memory", 0), dtype="bfloat16", warmup=warmup,
                repeats=repeats)  # fmt: skip
    result = fused_attention.compute(cell)
    return {"ms": 1e3 * result["seconds"], "tflops": result["tflops"], "warmup": warmup,
            "repeats": repeats, "interpreted": result["interpreted"]}  # fmt: skip


KERNEL_LENGTHS, KERNEL_MEMORIES = (8192, 1024, 4096, 16384, 32768), (0, 512, 4096)


def kernels_rows(quick: bool) -> list[dict]:
    cpu = on_cpu()
    if cpu or quick:
        size = dict(SIZES["tiny"], layers=1, seg=0, mem=0) if cpu else ATTENTION
        lengths, memories = ((32,), (0, 16)) if cpu else ((1024,), (0, 512))
    else:
        size, lengths, memories = ATTENTION, KERNEL_LENGTHS, KERNEL_MEMORIES
    tokens = 2 * lengths[0] if cpu else TOKENS
    cells = []
    for length in lengths:
        for memory in memories:
            impls = [("txl", "kernel"), ("txl", "tiled"), ("rope", "kernel")]
            impls += [("rope", "cudnn")] if memory == 0 else []  # its causal mask assumes none
            cells += [(scheme, impl, length, memory) for scheme, impl in impls]
    return [
        dict(name=f"{scheme} {impl} T={length} M={memory}", scheme=scheme, impl=impl,
             length=length, memory=memory, batch=max(1, tokens // length), size=size)
        for scheme, impl, length, memory in cells
    ]  # fmt: skip


def profile_rows(quick: bool) -> list[dict]:
    return [dict(name="base", size=quick_size() if quick else SIZES["base"], impl="dense")]


def profile_row(spec: dict, quick: bool) -> dict:
    from bench import gpu_profile

    return gpu_profile.profile(Step(spec["size"]), steps=2 if quick else 5)


ROWS = {"training": training_rows, "depth": depth_rows, "attention": attention_rows,
        "profile": profile_rows, "kernels": kernels_rows}  # fmt: skip
MEASURE = {"training": training_row, "depth": depth_row, "attention": attention_row,
           "profile": profile_row, "kernels": attention_row}  # fmt: skip


def first_line(error: BaseException) -> str:
    text = f"{type(error).__name__}: {error}".strip()
    return text.splitlines()[0][:300]


def meta(quick: bool) -> dict:
    import flax
    import jax
    import jaxlib

    device = jax.devices()[0]
    return {
        "device": device.device_kind, "backend": jax.default_backend(),
        "device_count": jax.device_count(), "jax": jax.__version__, "jaxlib": jaxlib.__version__,
        "flax": flax.__version__, "python": sys.version.split()[0], "commit": revision(),
        "command": os.environ.get("GPU_BENCH_COMMAND", "python -m bench.gpu"), "quick": quick,
        "peak_tflops_bf16": peak_tflops(),
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
    }  # fmt: skip


def revision() -> str:
    """The commit measured: ``GPU_BENCH_COMMIT`` where the copy on the device has no git history."""
    if os.environ.get("GPU_BENCH_COMMIT"):
        return os.environ["GPU_BENCH_COMMIT"]
    try:
        return commit() or "unknown (no git history here)"
    except OSError:  # no git
        return "unknown (no git here)"


def load(path: pathlib.Path) -> dict:
    return json.loads(path.read_text()) if path.exists() else {"meta": {}, "tables": {}}


def save(path: pathlib.Path, results: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_suffix(".json.partial")
    scratch.write_text(json.dumps(results, indent=1) + "\n")
    scratch.replace(path)


def plain(spec: dict) -> dict:
    """A row's settings as the JSON keeps them (the size dict flattened into its fields)."""
    return dict(spec.get("size", {})) | {k: v for k, v in spec.items() if k != "size"}


def measure_table(table: str, path: pathlib.Path, quick: bool, rows: int | None = None) -> dict:
    enable_cache()
    started = time.perf_counter()
    results = load(path)
    results["meta"] = meta(quick)
    entry = {
        "command": " ".join(["python -m bench.gpu", *sys.argv[1:]]), "quick": quick,
        "date": results["meta"]["date"], "outcome": "running", "rows": [],
    }  # fmt: skip
    results["tables"][table] = entry
    specs = ROWS[table](quick)[:rows]
    for i, spec in enumerate(specs, 1):
        row = plain(spec)
        try:
            row |= {"outcome": "ok", **MEASURE[table](spec, quick)}
        except Exception as error:  # a row that fails is recorded, the table goes on
            row["outcome"] = first_line(error)
        entry["rows"].append(row)
        entry["seconds"] = time.perf_counter() - started
        save(path, results)
        print(f"  {table} {i}/{len(specs)} {spec['name']}: {summary(row)} "
              f"({entry['seconds']:.0f} s)", flush=True)  # fmt: skip
    entry["outcome"] = "ok"
    save(path, results)
    return results


def summary(row: dict) -> str:
    if row["outcome"] != "ok":
        return row["outcome"]
    shown = [
        (k, row[k])
        for k in ("compile_s", "step_ms", "tokens_per_sec", "mfu", "ms")
        if row.get(k) is not None
    ]
    return ", ".join(f"{k} {v:,.3g}" for k, v in shown) or "ok"


def record(table: str, outcome: str, path: pathlib.Path) -> None:
    """Notes what gpu.sh saw of ``table`` (a time-out, a crash, the kernel tests' summary)."""
    results = load(path)
    entry = results["tables"].setdefault(table, {"rows": []})
    entry["outcome"] = outcome
    save(path, results)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--table", choices=TABLES)
    parser.add_argument("--record", metavar="TABLE", help="note an outcome for TABLE (gpu.sh)")
    parser.add_argument("--outcome", default="", help="with --record: what happened")
    parser.add_argument("--json", required=True, type=pathlib.Path, help="results file (merged)")
    parser.add_argument("--quick", action="store_true", help="small sizes, few rows and steps")
    parser.add_argument("--rows", type=int, help="only the table's first ROWS rows")
    args = parser.parse_args(argv)
    if args.record:
        record(args.record, args.outcome, args.json)
    elif args.table:
        measure_table(args.table, args.json, args.quick, args.rows)
    else:
        parser.error("give --table or --record")


if __name__ == "__main__":
    main()
