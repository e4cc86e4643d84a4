"""Dense against tiled attention: memory and time of an evaluation pass and a training step.

    python -m bench.tiled_attention [--schemes txl,shaw,t5,rope] [--eval-windows 512,...,32768]
        [--train-windows 512,...,16384]

txl_small sizes (6 layers, d_model 256, 4 heads), batch 1, an attention window of K keys: a segment
of K/2 tokens after a full memory of K/2; tiles of ``--query-tile`` queries by ``--tile`` keys. Each
cell runs in its own process (``measure.isolated``):
XLA's temporary memory of the compiled program (``memory_analysis``: what the attention's
intermediates need, read before anything runs), the process's peak resident memory, and the median
time of the compiled call (``--repeats`` calls after a warm-up; more, up to 9, for a call under a
second, so that about 2 s are timed). A cell whose temporary memory would not fit ``--max-gib`` is
not run and reads "out of memory". At ``--ratio-windows`` dense and tiled are also timed side by
side: both compiled in one process and called in turn (the machine's load then falls on both).
Writes ``tiled_attention.json`` (settings, commit, every cell) in ``--out`` (default
``docs/benchmarks``) after every cell, and renders ``tiled_attention.md`` from it, with the checks:
tiled peak memory 16k over 8k (linear: ≤ 2.2×), tiled over dense temporary memory at 8k (≤ 1/8),
tiled over dense time at 1k side by side (≤ 1.3×). A stopped run, started again with the same
command, keeps the cells it measured and goes on (``--fresh``: measure them all again).
"""

from __future__ import annotations

import datetime
import json
import pathlib
import statistics
import time

from bench import args as bench_args
from bench.measure import (
    SIZES,
    commit,
    isolated,
    machine,
    median_seconds,
    our_model,
    parse_or_serve,
)


def _program(spec: dict, impl: str):
    """The compiled call of one cell (``impl``: dense or tiled) and XLA's temporary bytes."""
    import jax
    import jax.numpy as jnp
    from flax import nnx

    half = spec["window"] // 2
    model = our_model(
        spec["scheme"], SIZES["small"], mem_len=half, attention_impl=impl,
        key_tile=spec["tile"], query_tile=spec["query_tile"],
    )  # fmt: skip
    tokens = jax.random.randint(jax.random.PRNGKey(0), (1, half), 0, 256)
    graphdef, state = nnx.split(model)
    training = spec["task"] == "train"
    mems = model.init_mems(1, keys_values=not training)
    mems = mems._replace(valid=jnp.asarray(half, jnp.int32))  # a full memory

    def evaluate(state, tokens, mems):
        return nnx.merge(graphdef, state)(tokens, mems)[0].sum()

    def loss(model, tokens, mems):
        logits, _ = model(tokens, mems, deterministic=False)
        return logits.std()

    def gradients(state, tokens, mems):  # of the parameters; dropout's counters move (nnx.grad)
        return nnx.grad(loss)(nnx.merge(graphdef, state), tokens, mems)

    step = jax.jit(gradients if training else evaluate)
    compiled = step.lower(state, tokens, mems).compile()
    call = lambda: jax.block_until_ready(compiled(state, tokens, mems))  # noqa: E731
    return call, compiled.memory_analysis().temp_size_in_bytes


def compute(spec: dict) -> dict:
    if spec["impl"] == SIDE_BY_SIDE:
        return _side_by_side(spec)
    call, temp = _program(spec, spec["impl"])
    if temp > spec["max_bytes"]:
        return {"temp_mib": temp / 2**20, "seconds": None, "skipped": "out of memory"}
    start = time.perf_counter()
    call()  # the warm-up, timed: a short call is timed more often, for about 2 s in all (≤ 9)
    calls = max(spec["repeats"], min(9, int(2.0 / (time.perf_counter() - start))))
    seconds = median_seconds(call, calls, 0)
    return {"temp_mib": temp / 2**20, "seconds": seconds, "timed_calls": calls}


SIDE_BY_SIDE = "side by side"
ROUNDS = 11


def _side_by_side(spec: dict) -> dict:
    """Dense and tiled compiled in one process and called in turn, ``ROUNDS`` times after a
    warm-up each: the median of the rounds' tiled/dense ratios (the machine's load shared)."""
    calls = {impl: _program(spec, impl)[0] for impl in ("dense", "tiled")}
    times: dict[str, list[float]] = {impl: [] for impl in calls}
    for call in calls.values():
        call()
    for _ in range(ROUNDS):
        for impl, call in calls.items():
            start = time.perf_counter()
            call()
            times[impl].append(time.perf_counter() - start)
    ratios = [t / d for t, d in zip(times["tiled"], times["dense"], strict=True)]
    median = statistics.median
    return {
        "dense_s": median(times["dense"]), "tiled_s": median(times["tiled"]),
        "ratio": median(ratios), "ratio_range": [min(ratios), max(ratios)], "rounds": ROUNDS,
    }  # fmt: skip


def render(results: dict) -> str:
    s = results["settings"]
    lines = [
        "# Dense and tiled attention: memory and time",
        "",
        f"Command: `{s['command']}`  ",
        f"{_counted(results, 'machine', 'Machine')}; {_counted(results, 'commit', 'commit')}; "
        f"{s['date']}.",
        "",
        "txl_small sizes, batch 1, window K = segment K/2 + full memory K/2; tiles of "
        f"{s['query_tile']} queries by {s['tile']} keys. *temp*: XLA's temporary memory of the "
        "compiled call (MiB); *peak*: the process's resident peak (MiB, with JAX itself); *s*: "
        "median seconds of the call.",
        "",
    ]
    for task in s["tasks"]:
        lines += [
            f"## {'Training step (forward + backward)' if task == 'train' else 'Evaluation pass'}",
            "",
            "| scheme | K | dense temp | tiled temp | dense peak | tiled peak | dense s | tiled s |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for cell in (c for c in results["cells"] if c["task"] == task and c["impl"] == "dense"):
            tiled = next(
                (
                    c for c in results["cells"]
                    if c["task"] == task and c["impl"] == "tiled"
                    and (c["scheme"], c["window"]) == (cell["scheme"], cell["window"])
                ),
                {"pending": True},
            )  # fmt: skip
            row = [cell["scheme"], f"{cell['window']:,}"]
            row += [_mib(cell, "temp_mib"), _mib(tiled, "temp_mib")]
            row += [_mib(cell, "peak_mib"), _mib(tiled, "peak_mib")]
            row += [_seconds(cell), _seconds(tiled)]
            lines.append("| " + " | ".join(row) + " |")
        lines.append("")
    return "\n".join(lines + _side_by_side_table(results["cells"]) + _checks(results["cells"]))


def _side_by_side_table(cells: list[dict]) -> list[str]:
    """The dense and tiled times measured in turn in one process (what the time check reads)."""
    pairs = [c for c in cells if c["impl"] == SIDE_BY_SIDE]
    if not pairs:
        return []
    lines = [
        "## Side by side",
        "",
        f"Dense and tiled compiled in one process and called in turn, {ROUNDS} rounds after a "
        "warm-up: the median seconds of each and the median (and range) of the rounds' "
        "tiled / dense ratios.",
        "",
        "| task | scheme | K | dense s | tiled s | tiled / dense | range |",
        "|---|---|---:|---:|---:|---:|---:|",
    ]
    for c in pairs:
        if "error" in c:
            lines.append(f"| {c['task']} | {c['scheme']} | {c['window']:,} | error | | | |")
            continue
        low, high = c["ratio_range"]
        lines.append(
            f"| {c['task']} | {c['scheme']} | {c['window']:,} | {c['dense_s']:.3f} | "
            f"{c['tiled_s']:.3f} | {c['ratio']:.3f} | {low:.2f}–{high:.2f} |"
        )
    return [*lines, ""]


def _checks(cells: list[dict]) -> list[str]:
    """The targets, each as measured: linear tiled memory, the 8k memory ratio, the 1k time."""

    def value(task, scheme, window, impl, key):
        """The cell's ``key``; None if it is missing or failed. A skipped (out of memory) cell
        has only its compiled temporary memory."""
        for c in cells:
            if (c["task"], c["scheme"], c["window"], c["impl"]) == (task, scheme, window, impl):
                usable = "error" not in c and (not c.get("skipped") or key == "temp_mib")
                return c.get(key) if usable else None
        return None

    lines = [
        "## Checks",
        "",
        "| task | scheme | tiled peak 16k / 8k (≤ 2.2) | tiled / dense temp at 8k (≤ 0.125) "
        "| tiled / dense time at 1k, side by side (≤ 1.3) |",
        "|---|---|---:|---:|---:|",
    ]
    for task, scheme in dict.fromkeys((c["task"], c["scheme"]) for c in cells):
        ratios = []
        for (w1, i1, k1), (w2, i2, k2) in (
            ((16384, "tiled", "peak_mib"), (8192, "tiled", "peak_mib")),
            ((8192, "tiled", "temp_mib"), (8192, "dense", "temp_mib")),
        ):
            a, b = value(task, scheme, w1, i1, k1), value(task, scheme, w2, i2, k2)
            ratios.append("–" if a is None or not b else f"{a / b:.3f}")
        ratio = value(task, scheme, 1024, SIDE_BY_SIDE, "ratio")
        ratios.append("–" if ratio is None else f"{ratio:.3f}")
        lines.append(f"| {task} | {scheme} | " + " | ".join(ratios) + " |")
    return [*lines, ""]


def _counted(results: dict, key: str, name: str) -> str:
    """``name X`` (the cells' ``key``: commit or machine), or, for a run resumed across commits or
    machines, each value and its cells' count."""
    counts: dict[str, int] = {}
    for cell in results["cells"]:
        at = cell.get(key, results["settings"][key])
        counts[at] = counts.get(at, 0) + 1
    if len(counts) == 1:
        return f"{name} {next(iter(counts))}"
    return f"{name}s " + ", ".join(f"{c} ({n} cells)" for c, n in counts.items())


def _mib(cell: dict, key: str) -> str:
    if cell.get("pending"):
        return "–"
    if "error" in cell:
        return "error"
    if key == "peak_mib" and cell.get("skipped"):
        return cell["skipped"]
    return f"{cell[key]:,.0f}"


def _seconds(cell: dict) -> str:
    if cell.get("pending"):
        return "–"
    if "error" in cell or cell.get("seconds") is None:
        return cell.get("skipped", "error")
    return f"{cell['seconds']:.3f}"


def _flag_value(value) -> str:
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def main() -> None:
    parser = bench_args.parser(__doc__)
    bench_args.add_schemes(parser, default=("txl", "shaw", "t5", "rope"))
    windows = "512,1024,2048,4096,8192,16384"
    parser.add_argument("--eval-windows", type=bench_args.ints, default=windows + ",32768")
    parser.add_argument("--train-windows", type=bench_args.ints, default=windows)
    parser.add_argument(
        "--tasks", type=bench_args.listed(choices=("eval", "train")), default="eval,train"
    )
    parser.add_argument(
        "--ratio-windows", type=bench_args.ints, default="1024",
        help="windows where dense and tiled are also timed side by side, in turn in one process",
    )  # fmt: skip
    parser.add_argument("--tile", type=int, default=512, help="keys per tile")
    parser.add_argument("--query-tile", type=int, default=512, help="queries per tile")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-gib", type=float, default=16.0)
    parser.add_argument(
        "--fresh", action="store_true", help="measure every cell again (default: resume)"
    )
    bench_args.add_out(parser)
    args = parse_or_serve(parser, compute)
    if args is None:
        return
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    # Resumable: a cell already in the JSON with the same spec is kept, so a stopped run goes on
    # where it stopped (--fresh: measure everything again). The JSON is written after every cell.
    done = [] if args.fresh else _cells(out / "tiled_attention.json")
    head, here = commit(), machine()
    windows_of = {"eval": args.eval_windows, "train": args.train_windows}
    tasks = {task: windows_of[task] for task in args.tasks}
    cells = []
    for task, task_windows in tasks.items():
        for scheme in args.schemes:
            runs = [(w, impl) for w in task_windows for impl in ("dense", "tiled")]
            for window, impl in runs + [(w, SIDE_BY_SIDE) for w in args.ratio_windows]:
                spec = dict(
                    scheme=scheme, window=window, impl=impl, task=task, tile=args.tile,
                    query_tile=args.query_tile, repeats=args.repeats,
                    max_bytes=int(args.max_gib * 2**30),
                )  # fmt: skip
                cell = next((c for c in done if _spec_of(c) == spec), None)
                if cell is None:
                    measured = isolated("bench.tiled_attention", spec)
                    cell = {**spec, **measured, "commit": head, "machine": here}
                    print(json.dumps(cell), flush=True)
                cells.append(cell)
                _write(out, args, tasks, head, cells + _others(done, cells))
    print(render(_write(out, args, tasks, head, cells + _others(done, cells))))


def _cells(path: pathlib.Path) -> list[dict]:
    """The cells of an earlier run, each with the commit it was measured at."""
    if not path.exists():
        return []
    earlier = json.loads(path.read_text())
    stamp = {key: earlier["settings"][key] for key in ("commit", "machine")}
    return [{**stamp, **c} for c in earlier["cells"]]


def _spec_of(cell: dict) -> dict:
    keys = ("scheme", "window", "impl", "task", "tile", "query_tile", "repeats", "max_bytes")
    return {k: cell.get(k) for k in keys}


def _others(done: list[dict], cells: list[dict]) -> list[dict]:
    """The cells of earlier runs with this run's tile sizes, repeats and memory limit that it has
    not measured (not reached yet, or other schemes, windows or tasks): kept."""
    same = ("tile", "query_tile", "repeats", "max_bytes")
    reached = [_spec_of(c) for c in cells]
    return [
        c for c in done
        if _spec_of(c) not in reached and all(c.get(k) == cells[0][k] for k in same)
    ]  # fmt: skip


def _write(out: pathlib.Path, args, tasks: dict, head: str, cells: list[dict]) -> dict:
    """Writes the JSON and the table rendered from it; the results."""
    settings = {
        "command": "python -m bench.tiled_attention "
        + " ".join(
            f"--{k.replace('_', '-')}={_flag_value(v)}"
            for k, v in vars(args).items()
            if k not in ("worker", "out", "fresh")
        ),
        "machine": machine(),
        "commit": head,
        "date": datetime.date.today().isoformat(),
        "tasks": list(tasks),
        "tile": args.tile,
        "query_tile": args.query_tile,
    }
    results = {"settings": settings, "cells": cells}
    (out / "tiled_attention.json").write_text(json.dumps(results, indent=1) + "\n")
    (out / "tiled_attention.md").write_text(render(results) + "\n")
    return results


if __name__ == "__main__":
    main()
