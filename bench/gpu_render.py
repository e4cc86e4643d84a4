"""Renders ``bench.gpu``'s JSON as markdown: ``python -m bench.gpu_render --json gpu.json --out gpu.md``.

A header (device, versions, commit, date, command), the targets with met / missed computed from the
measured rows (or "not measured" and why), then one section a table with its settings. NVIDIA's
published Transformer-XL base figure is a reference row, marked as published and scaled, never as
a measurement of this run.
"""

from __future__ import annotations

import argparse
import json
import pathlib

NVIDIA_A100 = 59_961  # tokens/s, NVIDIA's PyTorch Transformer-XL base (enwik8 sizes), one A100, AMP
A100_BF16, HOPPER_BF16 = 312.0, 989.0  # dense bf16 peak TFLOP/s (the vendors' data sheets)
NVIDIA_SCALED = 190_064  # the issue's figure for NVIDIA_A100 × HOPPER_BF16 / A100_BF16 (190,069)
MFU_BASE, MFU_LARGE, COMPILE_LARGE_S = 0.30, 0.45, 60.0
# the kernels' time at T = 8k against cuDNN's with RoPE, at most (txl does half again the products)
KERNEL_VS_CUDNN = {"txl": 1.5, "t5": 1.2, "alibi": 1.2, "kerple": 1.2, "shaw": 1.5, "fire": 1.5}


def _f(value, spec: str = ",.0f", suffix: str = "") -> str:
    return "" if value is None else f"{format(value, spec)}{suffix}"


def _pct(value) -> str:
    return "" if value is None else f"{100 * value:.1f}%"


def _ok(rows: list[dict], **match) -> list[dict]:
    return [
        r for r in rows if r.get("outcome") == "ok" and all(r.get(k) == v for k, v in match.items())
    ]


def _rows(results: dict, table: str) -> list[dict]:
    return results.get("tables", {}).get(table, {}).get("rows", [])


def _status(value, target, *, at_most: bool = False) -> str:
    met = value <= target if at_most else value >= target
    return "**met**" if met else "**missed**"


def targets(results: dict) -> list[tuple[str, str, str]]:
    """(target, measured, status) for each target of the issue, from the measured rows only."""
    meta, out = results.get("meta", {}), []
    quick = meta.get("quick")
    training = _rows(results, "training")
    peak = meta.get("peak_tflops_bf16")

    def best(rows, key):
        rows = [r for r in rows if r.get(key) is not None]
        return max(rows, key=lambda r: r[key]) if rows else None

    for name, goal in (("base", MFU_BASE), ("large", MFU_LARGE)):
        label = f"{name}: bf16 MFU ≥ {goal:.0%}"
        row = best(_ok(training, name=name), "mfu")
        if row:
            seen = f"{_pct(row['mfu'])} ({row['impl']}{', remat' if row.get('remat') else ''})"
            out.append((label, seen, _status(row["mfu"], goal)))
        else:
            why = (
                "quick run"
                if quick
                else "no peak listed for this device"
                if not peak
                else "no row ran"
            )
            out.append((label, "", f"not measured ({why})"))
    row = best(_ok(training, name="base"), "tokens_per_sec")
    label = f"base: tokens/s ≥ {NVIDIA_SCALED:,} (NVIDIA's A100 figure scaled to a Hopper's peak)"
    if row and peak != HOPPER_BF16:
        seen = f"{row['tokens_per_sec']:,.0f} ({row['impl']})"
        out.append(
            (label, seen, f"not compared (the reference is scaled to {HOPPER_BF16:.0f} TFLOP/s)")
        )
    elif row:
        seen = f"{row['tokens_per_sec']:,.0f} ({row['impl']})"
        out.append((label, seen, _status(row["tokens_per_sec"], NVIDIA_SCALED)))
    else:
        out.append((label, "", f"not measured ({'quick run' if quick else 'no row ran'})"))
    label = f"large: step compiles in < {COMPILE_LARGE_S:.0f} s"
    rows = _ok(training, name="large", remat=False)
    if rows and not rows[0].get("cache_hit"):
        seen = f"{rows[0]['compile_s']:.1f} s"
        out.append((label, seen, _status(rows[0]["compile_s"], COMPILE_LARGE_S, at_most=True)))
    else:
        why = (
            "loaded from the compilation cache" if rows else "quick run" if quick else "no row ran"
        )
        out.append((label, "", f"not measured ({why})"))
    depth = {r["layers"]: r for r in _ok(_rows(results, "depth")) if not r.get("cache_hit")}
    label = "compile time: 48 layers ≤ 24 layers"
    if 24 in depth and 48 in depth:
        a, b = depth[24]["compile_s"], depth[48]["compile_s"]
        out.append((label, f"{b:.1f} s against {a:.1f} s", _status(b, a, at_most=True)))
    else:
        out.append(
            (label, "", f"not measured ({'quick run' if quick else 'no fresh compile of both'})")
        )
    cells = _attention_cells(results)
    cudnn = cells.get(("rope", 8192, "cudnn"))
    for scheme, most in KERNEL_VS_CUDNN.items():
        kernel = cells.get((scheme, 8192, "kernel"))
        label = f"{scheme} kernel at T = 8k, forward + backward, ≤ {most}× cuDNN (rope)"
        if kernel and cudnn:
            ratio = kernel["ms"] / cudnn["ms"]
            out.append((label, f"{ratio:.2f}×", _status(ratio, most, at_most=True)))
        else:
            out.append(
                (label, "", f"not measured ({'quick run' if quick else 'no pair of cells ran'})")
            )
    return out


def _attention_cells(results: dict) -> dict:
    return {(r["scheme"], r["length"], r["impl"]): r for r in _ok(_rows(results, "attention"))}


def _size(r: dict) -> str:
    return (
        f"{r['layers']} × d {r['d_model']} (d_ff {r['d_ff']}, {r['heads']} heads), "
        f"seg {r['seg']} + mem {r['mem']}, batch {r['batch']}"
    )


def _head(results: dict, table: str, title: str) -> list[str]:
    """The section's title, the table's command and date, and what stopped it if it did not finish."""
    entry = results.get("tables", {}).get(table)
    if entry is None:
        return [title, "", "Not run.", ""]
    outcome = entry.get("outcome", "ok")
    if not entry.get("rows"):
        return [title, "", f"No row: {outcome}.", ""]
    lines = [title, "", f"Command: `{entry.get('command', '')}`; {entry.get('date', '')}."]
    if outcome != "ok":
        lines.append(f"**The table did not finish: {outcome}** (the rows it finished are below).")
    return [*lines, ""]


def training(results: dict) -> list[str]:
    rows = _rows(results, "training")
    first = rows[0] if rows else {}
    lines = _head(results, "training", "## Training step")
    if not _rows(results, "training"):
        return lines
    lines += [
        "configs/txl_base_enwik8.py's step (`relpos_jax.train_step`, as `train.py` runs it: dropout "
        "0.1, Adam, clipping 0.25, memory carried), bf16, random tokens; "
        f"after {first.get('warmup', '')} warm-up steps, the median of {first.get('repeats', '')} "
        "synchronised steps (tokens/s, TFLOP/s and MFU from it) and the mean of as many pipelined "
        "ones. TFLOP/s: `bench.mfu.model_flops` per token; MFU over the device's dense bf16 peak. "
        "Compile: lower + compile; *cached*: loaded from the persistent compilation cache. Memory: "
        "XLA's buffer assignment of the program (arguments + outputs − donated + temporaries).",
        "",
        "| model | attention | remat | tokens/s | step ms | pipelined tokens/s | model TFLOP/s "
        "| MFU | compile s | memory GiB | outcome |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        ok = r.get("outcome") == "ok"
        compile_s = _f(r.get("compile_s"), ".1f", " (cached)" if r.get("cache_hit") else "")
        lines.append(
            f"| {r['name']}: {_size(r)} | {r['impl']} | {'yes' if r.get('remat') else 'no'} | "
            f"{_f(r.get('tokens_per_sec'))} | {_f(r.get('step_ms'), '.1f')} | "
            f"{_f(r.get('tokens_per_sec_pipelined'))} | {_f(r.get('tflops'), '.1f')} | "
            f"{_pct(r.get('mfu'))} | {compile_s} | {_f(r.get('program_gib'), '.2f')} | "
            f"{'ok' if ok else r.get('outcome', '')} |"
        )
    lines.append(
        f"| reference: NVIDIA's PyTorch Transformer-XL base, published for one A100 "
        f"({NVIDIA_A100:,} tokens/s), × {HOPPER_BF16:.0f}/{A100_BF16:.0f} bf16 peaks | | | "
        f"{NVIDIA_SCALED:,} (scaled, not measured here) | | | | | | | |"
    )
    return [*lines, ""]


def depth(results: dict) -> list[str]:
    lines = _head(results, "depth", "## Compile time against depth")
    if not _rows(results, "depth"):
        return lines
    lines += [
        f"The training step (bf16, dense, {_size(_rows(results, 'depth')[0]).split(' × ', 1)[1]}) "
        "at each depth, lowered and compiled for abstract inputs; the layers are one `jax.lax.scan`.",
        "",
        "| layers | lower + compile s | lower s | memory GiB | outcome |",
        "|---:|---:|---:|---:|---|",
    ]
    fresh = {
        (r["layers"], r["d_model"]): r
        for r in _ok(_rows(results, "training"), impl="dense", remat=False)
        if not r.get("cache_hit")
    }
    for r in _rows(results, "depth"):
        compile_s = _f(r.get("compile_s"), ".1f")
        same = fresh.get((r["layers"], r["d_model"]))
        if r.get("cache_hit"):  # the same program compiled in the training table
            compile_s = (
                f"{same['compile_s']:.1f} (training table)" if same else f"{compile_s} (cached)"
            )
        lines.append(
            f"| {r['layers']} | {compile_s} | {_f(r.get('lower_s'), '.1f')} "
            f"| {_f(r.get('program_gib'), '.2f')} | {r.get('outcome', '')} |"
        )
    return [*lines, ""]


def attention(results: dict) -> list[str]:
    rows = _rows(results, "attention")
    lines = _head(results, "attention", "## One attention layer, forward and backward")
    if not _rows(results, "attention"):
        return lines
    s = rows[0] if rows else {}
    lines += [
        f"`bench.fused_attention.compute`: one layer of d_model {s.get('d_model', '')} "
        f"({s.get('heads', '')} heads), causal, no memory, bf16, B·T fixed; the gradient of the "
        "layer (projections, position terms, attention) in ms (median of "
        f"{s.get('repeats', '')} after {s.get('warmup', '')}). cuDNN: "
        '`jax.nn.dot_product_attention(implementation="cudnn")` between rope\'s projections. '
        "TFLOP/s: the causal attention core, 3.5 × 2·2·N·H·T²/2 a row.",
        "",
        "| T | B | scheme | dense ms | tiled ms | kernel ms | kernel TFLOP/s | cuDNN (rope) ms "
        "| kernel / cuDNN |",
        "|---:|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    cells = {(r["scheme"], r["length"], r["impl"]): r for r in rows}
    for length in sorted({r["length"] for r in rows}):
        cudnn = cells.get(("rope", length, "cudnn"), {})
        schemes = dict.fromkeys(["txl", "rope", *(r["scheme"] for r in rows)])
        for scheme in [x for x in schemes if any(k[:2] == (x, length) for k in cells)]:
            got = [cells.get((scheme, length, i), {}) for i in ("dense", "tiled", "kernel")]
            ms = [_f(c.get("ms"), ",.2f") or c.get("outcome", "") for c in got]
            kernel = got[2]
            ratio = kernel.get("ms") / cudnn["ms"] if kernel.get("ms") and cudnn.get("ms") else None
            batch = next((c["batch"] for c in got if "batch" in c), "")
            lines.append(
                f"| {length:,} | {batch} | {scheme} | {' | '.join(ms)} | "
                f"{_f(kernel.get('tflops'), '.1f')} | "
                f"{_f(cudnn.get('ms'), ',.2f') or cudnn.get('outcome', '')} | {_f(ratio, '.2f')} |"
            )
    if any(r.get("interpreted") for r in rows):
        lines += ["", "On a CPU the kernels run in Pallas' interpreter: a smoke test, not a speed."]
    return [*lines, ""]


def profile(results: dict) -> list[str]:
    lines = _head(results, "profile", "## Where the base training step's time goes")
    if not _rows(results, "profile"):
        return lines
    for r in _rows(results, "profile"):
        if r.get("outcome") != "ok":
            lines += [f"{r['name']}: {r.get('outcome')}", ""]
            continue
        lines += [
            f"{r['name']}: {_size(r)}, bf16, dense; {r['steps']} pipelined steps under "
            f"`jax.profiler.trace` ({r['events']:,} events from the {r['source']}). A step: "
            f"{r['wall_ms']:.2f} ms wall, device busy {r['busy_ms']:.2f} ms, host gap (wall − busy) "
            f"{r['host_gap_ms']:.2f} ms; events summed {r['summed_ms']:.2f} ms. Profiling slows "
            "the step a little.",
            "",
            "| kind of kernel | ms a step | share |",
            "|---|---:|---:|",
            *(f"| {k['kind']} | {k['ms']:.2f} | {_pct(k['share'])} |" for k in r["kinds"]),
            "",
            "| phase (from the JAX name stack) | ms a step | share |",
            "|---|---:|---:|",
            *(f"| {p['phase']} | {p['ms']:.2f} | {_pct(p['share'])} |" for p in r["phases"]),
            "",
            "The longest kernels:",
            "",
            "| kernel | kind | ms a step | calls a step | JAX op |",
            "|---|---|---:|---:|---|",
            *(
                f"| `{k['name']}` | {k['kind']} | {k['ms']:.3f} | {k['calls']:.0f} | "
                f"{k['op'].replace('|', '/')} |"
                for k in r["kernels"]
            ),
            "",
        ]
    return lines


def kernels(results: dict) -> list[str]:
    rows = _rows(results, "kernels")
    if "kernels" not in results.get("tables", {}):
        return []
    lines = _head(results, "kernels", "## The kernels over lengths and memories")
    if not rows:
        return lines
    s = rows[0]
    lines += [
        f"`bench.fused_attention.compute`: one layer of d_model {s.get('d_model', '')} "
        f"({s.get('heads', '')} heads), causal, bf16, B·T fixed, forward and backward in ms "
        f"(median of {s.get('repeats', '')} after {s.get('warmup', '')}); memory M keys before "
        "the T queries. cuDNN: rope's projections, no memory.",
        "",
        "| T | M | B | txl kernel | txl tiled | rope kernel | cuDNN (rope) | txl kernel / cuDNN |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    cells = {(r["scheme"], r["impl"], r["length"], r["memory"]): r for r in rows}
    keys = sorted({(r["length"], r["memory"]) for r in rows})
    for length, memory in keys:
        got = [cells.get((sc, impl, length, memory), {}) for sc, impl in
               (("txl", "kernel"), ("txl", "tiled"), ("rope", "kernel"))]  # fmt: skip
        cudnn = cells.get(("rope", "cudnn", length, 0), {})
        ms = [_f(c.get("ms"), ",.2f") or c.get("outcome", "") for c in (*got, cudnn)]
        ratio = got[0]["ms"] / cudnn["ms"] if got[0].get("ms") and cudnn.get("ms") else None
        batch = next((c["batch"] for c in got if "batch" in c), "")
        lines.append(
            f"| {length:,} | {memory:,} | {batch} | {' | '.join(ms)} | {_f(ratio, '.2f')} |"
        )
    return [*lines, ""]


def kernel_tests(results: dict) -> list[str]:
    entry = results.get("tables", {}).get("kernel_tests")
    if entry is None:
        return []
    return ["## Kernel tests on the device", "",
            '`pytest -k "not interpreted" tests/attention/kernel/kernel_vs_reference_test.py '
            'tests/attention/kernel/kernel_vs_tiled_test.py`: '
            f'{entry.get("outcome", "")}', ""]  # fmt: skip


def render(results: dict) -> str:
    m = results.get("meta", {})
    lines = [
        "# relpos_jax on an accelerator",
        "",
        "Written by `bash bench/gpu.sh` from the JSON beside this file (`python -m "
        "bench.gpu_render`); every number is this run's measurement, except the reference row "
        "marked as published.",
        "",
        f"Device: {m.get('device', '?')} ({m.get('backend', '?')}, {m.get('device_count', '?')} "
        f"device(s)); jax {m.get('jax', '?')}, jaxlib {m.get('jaxlib', '?')}, flax {m.get('flax', '?')}, "
        f"Python {m.get('python', '?')}; commit {m.get('commit', '?')}; {m.get('date', '?')}.  ",
        f"Command: `{m.get('command', '?')}`",
        "",
    ]
    if m.get("quick"):
        lines += ["**Quick run** (`--quick`): small sizes and few steps, to check that everything "
                  "compiles and runs; not the benchmark's numbers.", ""]  # fmt: skip
    sections = (kernels, kernel_tests)  # bash bench/gpu.sh --kernels
    if {"training", "attention"} & set(results.get("tables", {})):  # the whole benchmark
        lines += ["## Targets", "", "| target | measured | status |", "|---|---|---|"]
        lines += [f"| {t} | {seen} | {status} |" for t, seen, status in targets(results)]
        lines.append("")
        sections = (training, depth, attention, profile, kernels, kernel_tests)
    for section in sections:
        lines += section(results)
    return "\n".join(lines).rstrip() + "\n"


def faster(results: dict) -> dict[str, bool]:
    """``{scheme: {length: kernel faster}}``: at each length of the attention table where the
    kernel, dense and tiled cells of a scheme all ran, whether the kernel beat both; nothing unless
    the kernel tests passed on that GPU in the same run."""
    meta = results.get("meta", {})
    rows = _ok(_rows(results, "attention"))
    tests = results.get("tables", {}).get("kernel_tests", {}).get("outcome", "")
    passed = "passed" in tests and not any(word in tests for word in ("failed", "error"))
    if meta.get("quick") or meta.get("backend") != "gpu" or not passed:
        return {}  # a quick run, a CPU's interpreted kernels, or kernel tests that did not pass
    cells = {(r["scheme"], r["length"], r["impl"]): r["ms"] for r in rows}
    out: dict = {}
    for scheme, length, impl in cells:
        others = [cells.get((scheme, length, i)) for i in ("dense", "tiled")]
        if impl == "kernel" and None not in others:
            out.setdefault(scheme, {})[str(length)] = cells[scheme, length, impl] < min(others)
    return out


def write_faster(results: dict, path: pathlib.Path) -> None:
    """Merge this device's ``faster`` into ``path`` (``relpos_jax/attention/kernel/faster.json``)."""
    table = json.loads(path.read_text())
    measured = faster(results)
    if measured:
        table["devices"][results["meta"]["device"]] = measured
        path.write_text(json.dumps(table, indent=1) + "\n")
    print(f"{path}: {len(measured)} schemes measured on {results['meta'].get('device')}")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", required=True, type=pathlib.Path)
    parser.add_argument("--out", required=True, type=pathlib.Path)
    parser.add_argument(
        "--faster", type=pathlib.Path, help="also merge where the kernels won into this faster.json"
    )
    args = parser.parse_args(argv)
    results = json.loads(args.json.read_text())
    args.out.write_text(render(results))
    print(f"wrote {args.out}")
    if args.faster:
        write_faster(results, args.faster)


if __name__ == "__main__":
    main()
