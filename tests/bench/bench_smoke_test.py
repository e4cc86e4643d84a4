"""The benchmarks stay runnable: each runs once at toy sizes (``python -m bench.<name>``) and prints
its table, and the committed tables of docs/benchmarks/ are the ones their JSONs render. Those marked
``bench`` (several minutes together, most of it compiling in the fresh processes each benchmark cell
starts) run with ``make test-bench``, not in ``make test``; the research sweeps' are
tests/experiments/experiments_smoke_test.py."""

from __future__ import annotations

import collections
import json
import subprocess
import sys

import numpy as np
import pytest

from tests.helpers import ROOT


def bench(name: str, *flags: str) -> list[str]:
    """The command line of ``python -m bench.<name> flags...``, run with ``cwd=ROOT``."""
    return [sys.executable, "-m", f"bench.{name}", *flags]


@pytest.mark.slow
def test_bench_positions_runs():
    result = subprocess.run(
        bench("positions", "--lengths", "16", "--repeats", "1"),
        capture_output=True,
        text=True,
        timeout=300,
        check=True,
        cwd=ROOT,
    )
    rows = [
        line
        for line in result.stdout.splitlines()
        if line.startswith("| txl") or line.startswith("| shaw")
    ]
    assert len(rows) == 2, result.stdout


@pytest.mark.bench
def test_speed_benchmarks_run():
    """Toy sizes; x-transformers cells may say error where the bench extra is not installed."""
    runs = {
        "speed": ["--schemes", "txl", "--dtypes", "bfloat16", "--repeats", "1", "--rounds", "2"],
        "payoff": ["--contexts", "32", "--repeats", "1"],
        "scaling": ["--lengths", "16", "--schemes", "txl,shaw", "--repeats", "1"],
        "mfu": [
            *("--dtypes", "float32", "--repeats", "1", "--warmup", "1", "--remat"),
            *("--attention-impl", "kernel"),  # the train step through the kernels (interpreted)
        ],
        "kernels": ["--dtypes", "float32", "--repeats", "1"],
        "key_value_memory": ["--settings", "8:24", "--generate", "16", "--rounds", "1"],
    }
    for name, flags in runs.items():
        size = [] if name == "kernels" else ["--size", "tiny"]  # its shapes are txl_small's
        command = [sys.executable, "-X", "faulthandler", "-m", f"bench.{name}", *size, *flags]
        result = subprocess.run(
            command, capture_output=True, text=True, timeout=600, check=True, cwd=ROOT
        )
        rows = [line for line in result.stdout.splitlines() if line.startswith("| ")][1:]
        ours = {"speed": 4, "mfu": 5, "kernels": 4, "key_value_memory": 5}.get(name, 2)
        assert rows and all("error" not in row.split("|")[ours] for row in rows), result.stdout


@pytest.mark.bench
def test_fused_attention_benchmark_runs_and_renders_its_json(tmp_path):
    """The accelerator benchmark at a toy length on this CPU (the kernels interpreted)."""
    command = [
        sys.executable, "-m", "bench.fused_attention", "--lengths", "64", "--schemes", "txl,rope",
        "--repeats", "1", "--warmup", "0", "--out", str(tmp_path),
    ]  # fmt: skip
    result = subprocess.run(command, capture_output=True, text=True, timeout=600, cwd=ROOT)
    assert result.returncode == 0, result.stderr[-3000:]
    from bench import fused_attention

    results = json.loads((tmp_path / "fused_attention.json").read_text())
    cells = {(c["scheme"], c["impl"]): c for c in results["cells"]}
    assert set(cells) == {("txl", i) for i in ("kernel", "tiled", "dense")} | {
        ("rope", i) for i in fused_attention.IMPLS
    }
    assert all("seconds" in c for c in cells.values()), cells
    assert (tmp_path / "fused_attention.md").read_text() == fused_attention.render(results)


def test_the_committed_tiled_attention_table_is_rendered_from_its_json():
    from bench import tiled_attention

    results = json.loads((ROOT / "docs/benchmarks/tiled_attention.json").read_text())
    rendered = tiled_attention.render(results) + "\n"
    assert rendered == (ROOT / "docs/benchmarks/tiled_attention.md").read_text()


def test_the_committed_tpu_table_is_rendered_from_its_json():
    """docs/benchmarks/aot.md: every row's steps compiled, each training step fitting its chip as
    configured or with the change named beside it."""
    from bench import aot_table

    results = json.loads((ROOT / "docs/benchmarks/aot.json").read_text())
    assert [row["label"] for row in results["rows"]] == [row[0] for row in aot_table.ROWS]
    for row in results["rows"]:
        assert row["train"]["fits"] or "fits_with" in row["train"], row["label"]
        assert row["eval"]["fits"], row["label"]
    assert aot_table.render(results) == (ROOT / "docs/benchmarks/aot.md").read_text()


def test_the_committed_cubin_table_is_rendered_from_its_json():
    """docs/benchmarks/kernel_cubin.md: every kernel of every scheme at both launches on both chips;
    as launched now, none over the chip's shared memory, the spill budget, or reading early."""
    from bench import kernel_cubin

    results = json.loads((ROOT / "docs/benchmarks/kernel_cubin.json").read_text())
    launches = collections.Counter(row["launch"] for row in results["rows"])
    assert launches == {"first": 80, "fit": 80}
    assert not [row for row in results["rows"] if row["launch"] == "fit" and row["problems"]]
    assert kernel_cubin.render(results) == (ROOT / "docs/benchmarks/kernel_cubin.md").read_text()


def test_the_committed_context_parallel_table_is_rendered_from_its_json():
    from bench import context_parallel

    result = json.loads((ROOT / "docs/benchmarks/context_parallel.json").read_text())
    assert {row["devices"] for row in result["rows"]} == {1, 2, 4, 8}
    rendered = context_parallel.table(result)
    assert rendered == (ROOT / "docs/benchmarks/context_parallel.md").read_text()


@pytest.mark.bench
def test_bench_context_parallel_finds_the_longest_context(tmp_path):
    flags = ["--devices", "1,2", "--start", "256", "--limit", "1024", "--budget-mib", "100000"]
    result = subprocess.run(
        bench("context_parallel", *flags, "--out", str(tmp_path)),
        capture_output=True, text=True, timeout=900, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads((tmp_path / "context_parallel.json").read_text())["rows"]
    assert [(r["devices"], r["longest"]) for r in rows] == [(1, 1024), (2, 1024)]
    assert rows[1]["mib"] < rows[0]["mib"]  # two devices hold less each


@pytest.mark.bench
def test_bench_tiled_attention_writes_its_table_from_its_json(tmp_path):
    flags = ["--schemes", "txl", "--eval-windows", "64", "--train-windows", "64"]
    flags += ["--ratio-windows", "64", "--tile", "16", "--query-tile", "8", "--repeats", "1"]
    result = subprocess.run(
        bench("tiled_attention", *flags, "--out", str(tmp_path)),
        capture_output=True, text=True, timeout=600, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    cells = json.loads((tmp_path / "tiled_attention.json").read_text())["cells"]
    alone, side_by_side = cells[:2] + cells[3:5], [cells[2], cells[5]]
    assert all("error" not in c and c["temp_mib"] > 0 for c in alone), cells
    assert all(c["ratio"] > 0 and c["dense_s"] > 0 for c in side_by_side), cells
    table = (tmp_path / "tiled_attention.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| txl | 64 |")]
    assert len(rows) == 2  # an evaluation row and a training row
    assert "| eval | txl | 64 |" in table and "| train | txl | 64 |" in table  # side by side
    assert "| eval | txl |" in table and "| train | txl |" in table  # the checks


@pytest.mark.parametrize("platform", ["cpu", "gpu"])
def test_the_cudnn_cell_computes_the_dense_layer(platform):
    """``bench.fused_attention``'s cuDNN column (XLA's ``dot_product_attention`` here) is RoPE's
    layer as the dense path computes it, whether keys come ``[B, N, H, K]`` (a CPU's layout) or
    ``[B, K, N, H]`` (a GPU's: the H200 run refused a transposed query-sized key)."""
    import jax.numpy as jnp

    from bench import fused_attention
    from relpos_jax.ops import backend

    spec = dict(scheme="rope", impl="cudnn", length=16, memory=0, batch=2, dtype="float32",
                size={"layers": 1, "d_model": 32, "heads": 2, "d_ff": 64, "seg": 0, "mem": 0,
                      "batch": 2})  # fmt: skip
    with backend.target(platform):
        attention, x, window, ctx = fused_attention._layer(spec)
        assert attention.kv_layout == ("bnhk" if platform == "cpu" else "bknh")
        got = fused_attention._cudnn(attention, x, window, ctx, spec)
        want = attention(x, window, ctx, deterministic=True)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)
    assert not jnp.isnan(got).any()
