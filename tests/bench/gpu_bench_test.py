"""bench.gpu (the accelerator benchmark): its renderer, its trace summary, and one table end to end on
the CPU at the smallest size."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from bench import gpu, gpu_profile, gpu_render
from tests.helpers import ROOT

META = {
    "device": "NVIDIA H200", "backend": "gpu", "device_count": 1, "jax": "0.11.2",
    "jaxlib": "0.11.2", "flax": "0.12.10", "python": "3.12.3", "commit": "abc1234",
    "command": "bash bench/gpu.sh", "quick": False, "peak_tflops_bf16": 989.0,
    "date": "2026-12-05 10:00 UTC",
}  # fmt: skip
SIZE = dict(layers=12, d_model=512, heads=8, d_ff=2048, seg=512, mem=512, batch=22)
LARGE = dict(layers=24, d_model=1024, heads=16, d_ff=4096, seg=512, mem=512, batch=16)


def row(size, **fields):
    return {**size, "outcome": "ok", "cache_hit": False, **fields}


def results(**meta) -> dict:
    training = [
        row(SIZE, name="base", impl="dense", remat=False, mfu=0.25, tokens_per_sec=150_000.0,
            compile_s=30.0),
        row(SIZE, name="base", impl="kernel", remat=False, mfu=0.33, tokens_per_sec=200_000.0,
            compile_s=35.0),
        {**SIZE, "name": "base", "impl": "tiled", "remat": False, "outcome": "ValueError: no"},
        row(LARGE, name="large", impl="dense", remat=False, mfu=0.40, tokens_per_sec=1.0,
            compile_s=70.0),
        row(LARGE, name="large", impl="dense", remat=True, mfu=0.30, tokens_per_sec=1.0,
            compile_s=50.0),
    ]  # fmt: skip
    depth = [
        row(SIZE, name="12 layers", compile_s=31.0, lower_s=2.0, cache_hit=True),
        row({**SIZE, "layers": 24}, name="24 layers", compile_s=30.0, lower_s=2.0),
        row({**SIZE, "layers": 48}, name="48 layers", compile_s=29.0, lower_s=2.0),
    ]
    attention = [
        {"scheme": "txl", "impl": "kernel", "length": 8192, "batch": 2, "outcome": "ok",
         "ms": 3.0, "tflops": 100.0},
        {"scheme": "rope", "impl": "cudnn", "length": 8192, "batch": 2, "outcome": "ok", "ms": 2.5},
        {"scheme": "t5", "impl": "kernel", "length": 8192, "batch": 2, "outcome": "ok",
         "ms": 3.5, "tflops": 80.0},
    ]  # fmt: skip
    tables = {"training": training, "depth": depth, "attention": attention}
    return {
        "meta": {**META, **meta},
        "tables": {name: {"outcome": "ok", "rows": rows} for name, rows in tables.items()},
    }


def test_targets_are_met_or_missed_from_the_measured_rows():
    status = {target: (seen, s) for target, seen, s in gpu_render.targets(results())}
    assert status["base: bf16 MFU ≥ 30%"] == ("33.0% (kernel)", "**met**")
    assert status["large: bf16 MFU ≥ 45%"] == ("40.0% (dense)", "**missed**")
    tokens = next(v for k, v in status.items() if k.startswith("base: tokens/s ≥ 190,064"))
    assert tokens == ("200,000 (kernel)", "**met**")
    assert status["large: step compiles in < 60 s"] == ("70.0 s", "**missed**")
    assert status["compile time: 48 layers ≤ 24 layers"][1] == "**met**"
    kernel = next(v for k, v in status.items() if k.startswith("txl kernel at T = 8k"))
    assert kernel == ("1.20×", "**met**")
    t5 = next(v for k, v in status.items() if k.startswith("t5 kernel at T = 8k"))
    assert t5 == ("1.40×", "**missed**")  # 1.2× at most for a bias
    shaw = next(v for k, v in status.items() if k.startswith("shaw kernel at T = 8k"))
    assert shaw[1].startswith("not measured")


def test_a_quick_run_or_a_cached_compile_is_not_measured():
    quick = results(quick=True)
    quick["tables"] = {}
    assert all("not measured (quick run)" in s for _, _, s in gpu_render.targets(quick))
    cached = results()
    for r in cached["tables"]["training"]["rows"]:
        r["cache_hit"] = True
    status = {t: s for t, _, s in gpu_render.targets(cached)}
    assert "compilation cache" in status["large: step compiles in < 60 s"]


def test_render_has_the_header_the_reference_row_and_each_table():
    text = gpu_render.render(results())
    for field in ("NVIDIA H200", "jax 0.11.2", "flax 0.12.10", "abc1234", "2026-12-05 10:00 UTC",
                  "`bash bench/gpu.sh`"):  # fmt: skip
        assert field in text
    assert "190,064 (scaled, not measured here)" in text and "59,961" in text
    assert "ValueError: no" in text  # a failed row keeps its error
    assert "Quick run" not in text
    # The 12-layer depth row came from the cache: its compile time is the training table's.
    assert "| 12 | 30.0 (training table) |" in text
    assert "## Where the base training step's time goes" in text and "Not run." in text


def gpu_trace() -> list[dict]:
    meta = lambda kind, pid, name, tid=None: {  # noqa: E731
        "ph": "M", "name": kind, "pid": pid, **({"tid": tid} if tid is not None else {}),
        "args": {"name": name},
    }  # fmt: skip
    kernel = lambda name, ts, dur, tid=7, hlo=None: {  # noqa: E731
        "ph": "X", "pid": 1, "tid": tid, "ts": ts, "dur": dur, "name": name,
        "args": {"hlo_op": hlo or name},
    }  # fmt: skip
    return [
        meta("process_name", 1, "/device:GPU:0"),
        meta("process_name", 701, "/host:CPU"),
        meta("thread_name", 1, "Stream #7(Compute)", 7),
        meta("thread_name", 1, "XLA Ops", 9999),
        kernel("nvjet_tst_128x256_bf16", 0, 400, hlo="dot.3"),
        kernel("cudnn_generated_fort_native_sdpa", 400, 200, hlo="custom-call.1"),
        kernel("loop_add_fusion", 600, 100, hlo="loop_add_fusion.2"),
        kernel("input_reduce_fusion", 700, 100),
        kernel("loop_transpose_fusion", 800, 50),
        kernel("MemcpyD2D", 850, 50, hlo="copy.1"),
        kernel("mystery_kernel", 1500, 100),
        kernel("loop_add_fusion", 0, 1600, tid=9999),  # the derived line: not counted twice
        {"ph": "X", "pid": 701, "tid": 3, "ts": 0, "dur": 2000, "name": "PjitFunction(step)"},
    ]


def test_trace_summary_reads_the_gpu_streams_by_kind_and_phase():
    names = gpu_profile.op_names(
        '  %dot.3 = bf16[4,4] dot(a, b), metadata={op_name="jit(step)/transpose(jvp())/dot_general"}\n'
        '  loop_add_fusion.2 = f32[4] fusion(x), metadata={op_name="jit(step)/jvp()/add"}\n'
        '  ROOT %copy.1 = f32[4] copy(y), metadata={op_name="jit(step)/cond/branch_1_fun/mul"}\n'
    )
    assert names["loop_add_fusion_2"] == "jit(step)/jvp()/add"
    s = gpu_profile.summarize(gpu_trace(), steps=2, wall_us=2000.0, names=names)
    assert s["source"] == "device streams" and s["events"] == 7
    kinds = {k["kind"]: k["ms"] for k in s["kinds"]}
    assert kinds == {
        "matrix products": 0.2, "attention kernels (cuDNN, Pallas)": 0.1,
        "elementwise fusions": 0.05, "reductions": 0.05, "copies, transposes, slices": 0.05,
        "other": 0.05,
    }  # fmt: skip
    phases = {p["phase"]: p["ms"] for p in s["phases"]}
    assert phases == {"backward": 0.2, "forward": 0.05, "optimizer": 0.025, "unattributed": 0.225}
    assert s["busy_ms"] == pytest.approx(0.5)  # 0–900 and 1500–1600 µs over 2 steps
    assert s["host_gap_ms"] == pytest.approx(0.5)
    assert s["summed_ms"] == pytest.approx(0.5)
    assert s["kernels"][0]["name"] == "nvjet_tst_128x256_bf16"
    assert sum(k["share"] for k in s["kinds"]) == pytest.approx(1.0)


def test_trace_summary_of_a_cpu_trace_or_an_empty_one_does_not_fail():
    cpu = [
        {"ph": "M", "name": "process_name", "pid": 5, "args": {"name": "/host:CPU"}},
        {"ph": "X", "pid": 5, "tid": 1, "ts": 0, "dur": 10, "name": "$profiler.py trace"},
        {"ph": "X", "pid": 5, "tid": 2, "ts": 1, "dur": 5, "name": "ynn_fusion",
         "args": {"hlo_op": "ynn_fusion"}},
        {"ph": "X", "pid": 5, "tid": 2, "ts": 2, "dur": 3, "name": "wrapped_thing",
         "args": {"hlo_op": "wrapped_thing"}},
    ]  # fmt: skip
    s = gpu_profile.summarize(cpu, steps=1, wall_us=10.0)
    assert s["source"] == "host XLA ops" and s["events"] == 2
    assert s["busy_ms"] == pytest.approx(0.005) and s["host_gap_ms"] == pytest.approx(0.005)
    empty = gpu_profile.summarize([], steps=1, wall_us=10.0)
    assert empty["kinds"] == [] and empty["host_gap_ms"] == pytest.approx(0.01)


def test_a_real_trace_reads_the_same_from_its_json_and_its_xplane(tmp_path):
    import jax
    import jax.numpy as jnp

    f = jax.jit(lambda x: jnp.tanh(x @ x).sum())
    x = jnp.ones((64, 64))
    f(x).block_until_ready()
    with jax.profiler.trace(str(tmp_path)):
        f(x).block_until_ready()
    from_json = gpu_profile.summarize(gpu_profile.read_trace(tmp_path), steps=1, wall_us=1e3)
    (xplane,) = tmp_path.rglob("*.xplane.pb")
    from_xplane = gpu_profile.summarize(gpu_profile.xplane_events(xplane), steps=1, wall_us=1e3)
    assert from_json["events"] == from_xplane["events"] > 0
    assert from_json["busy_ms"] == pytest.approx(from_xplane["busy_ms"], rel=1e-3)


def test_record_notes_a_table_that_gpu_sh_stopped(tmp_path):
    path = tmp_path / "gpu.json"
    path.write_text(json.dumps(results()))
    gpu.record("training", "stopped at gpu.sh's limit of 240 s", path)
    gpu.record("kernel_tests", "12 passed in 40.0s", path)
    saved = json.loads(path.read_text())
    assert saved["tables"]["training"]["outcome"].startswith("stopped")
    assert len(saved["tables"]["training"]["rows"]) == 5  # the rows it finished are kept
    text = gpu_render.render(saved)
    assert "did not finish: stopped at gpu.sh's limit" in text and "12 passed in 40.0s" in text


@pytest.mark.slow
def test_training_table_runs_on_the_cpu_and_renders(tmp_path):
    path = tmp_path / "gpu.json"
    command = [sys.executable, "-m", "bench.gpu", "--table", "training", "--quick", "--rows", "2"]
    subprocess.run([*command, "--json", str(path)], cwd=ROOT, check=True, timeout=300)
    saved = json.loads(path.read_text())
    assert saved["meta"]["backend"] == "cpu" and saved["meta"]["quick"]
    rows = saved["tables"]["training"]["rows"]
    assert [(r["impl"], r["outcome"]) for r in rows] == [("dense", "ok"), ("kernel", "ok")]
    assert all(r["tokens_per_sec"] > 0 and r["mfu"] is None for r in rows)
    assert rows[0]["layers"] == 1 and rows[0]["d_model"] == 32  # SIZES["tiny"] on a CPU
    text = gpu_render.render(saved)
    assert "Quick run" in text and "| quick: 1 × d 32" in text


def test_where_the_kernels_won_is_recorded_only_when_their_tests_passed(tmp_path):
    """gpu_render --faster: the lengths at which the kernel beat dense and tiled, merged into the
    table ``model.attention_impl=auto`` reads, for the device measured."""
    measured = results()

    def cell(scheme, impl, length, ms):
        return {"scheme": scheme, "impl": impl, "length": length, "outcome": "ok", "ms": ms}

    measured["tables"]["attention"] = {"outcome": "ok", "rows": [
        cell("txl", "kernel", 1024, 2.0), cell("txl", "dense", 1024, 1.0),
        cell("txl", "tiled", 1024, 3.0), cell("txl", "kernel", 8192, 2.0),
        cell("txl", "dense", 8192, 5.0), cell("txl", "tiled", 8192, 4.0),
        cell("t5", "kernel", 8192, 1.0),  # no dense or tiled cell: nothing to compare
    ]}  # fmt: skip
    assert gpu_render.faster(measured) == {}  # no kernel tests on record
    measured["tables"]["kernel_tests"] = {"outcome": "36 passed in 80.1s", "rows": []}
    assert gpu_render.faster(measured) == {"txl": {"1024": False, "8192": True}}
    table = tmp_path / "faster.json"
    table.write_text(json.dumps({"about": "", "devices": {"NVIDIA A100": {"txl": {"512": True}}}}))
    gpu_render.write_faster(measured, table)
    assert json.loads(table.read_text())["devices"] == {
        "NVIDIA A100": {"txl": {"512": True}},
        "NVIDIA H200": {"txl": {"1024": False, "8192": True}},
    }
    measured["tables"]["kernel_tests"]["outcome"] = "2 failed, 34 passed in 80.1s"
    assert gpu_render.faster(measured) == {}
    assert gpu_render.faster(results(quick=True)) == {}


def test_the_kernels_table_starts_at_8k_and_runs_cudnn_without_memory_only(monkeypatch):
    monkeypatch.setattr(gpu, "on_cpu", lambda: False)
    rows = gpu.kernels_rows(quick=False)
    assert rows[0]["length"] == 8192 and {r["length"] for r in rows} == set(gpu.KERNEL_LENGTHS)
    assert {r["memory"] for r in rows if r["impl"] == "cudnn"} == {0}
    assert len(rows) == len(gpu.KERNEL_LENGTHS) * (3 * len(gpu.KERNEL_MEMORIES) + 1)
    assert all(r["batch"] * r["length"] == max(gpu.TOKENS, r["length"]) for r in rows)


def test_a_kernels_run_renders_its_tables_only():
    kernel = {"scheme": "txl", "impl": "kernel", "length": 8192, "memory": 512, "batch": 2,
              "outcome": "ok", "ms": 3.0, "d_model": 512, "heads": 8}  # fmt: skip
    cudnn = dict(kernel, scheme="rope", impl="cudnn", memory=0, ms=2.0)
    text = gpu_render.render({
        "meta": META, "tables": {
            "kernels": {"outcome": "ok", "rows": [kernel, cudnn]},
            "kernel_tests": {"outcome": "40 passed in 90.0s", "rows": []},
        },
    })  # fmt: skip
    assert "## Targets" not in text and "## Training step" not in text
    assert "| 8,192 | 512 | 2 | 3.00 |" in text and "1.50 |" in text  # against cuDNN at 8k
    assert "40 passed" in text


def test_a_training_row_builds_its_step_with_the_rows_overrides():
    """The diagnostic rows (the base step without dropout, RoPE's step) change the config they
    name and nothing else; each of the full table's rows builds its step (abstract, no compile)."""
    from bench.gpu_step import Step
    from bench.measure import SIZES

    rows = gpu.training_rows(quick=False)
    assert [r["name"] for r in rows[:2]] == ["base", "large"]  # the targets' rows first
    rope = next(r for r in rows if r.get("overrides") == ["model.position=rope"])
    step = Step(SIZES["tiny"], impl=rope["impl"], overrides=rope["overrides"])
    assert step.cfg.model.position == "rope" and step.cfg.model.dropout == 0.1
    plain = Step(SIZES["tiny"], overrides=["model.dropout=0.0"]).cfg.model
    assert plain.position == "txl" and plain.dropout == 0.0
