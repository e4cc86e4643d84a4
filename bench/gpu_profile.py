"""Where a training step's device time goes: one trace (``jax.profiler.trace``) read back by kind.

``profile(step)`` runs a few steps of a ``bench.gpu.Step`` under the profiler and summarises the
trace's ``*.trace.json.gz`` (Chrome trace format: ``"ph": "X"`` events with ``ts`` and ``dur`` in
µs; ``process_name`` and ``thread_name`` metadata events name the processes and threads).
``summarize(events, ...)`` is a pure function of those events:

* the device's events: on a GPU the kernels on the ``/device:GPU:N`` process's ``Stream …``
  threads (not the derived ``XLA Ops`` / ``XLA Modules`` lines, which repeat them); on a CPU the
  XLA thunks (events with an ``hlo_op``), which nest, so their sums there overcount;
* each event's kind (``CATEGORIES``, the first pattern that its name, HLO op and the op's JAX
  primitive match), and its phase from the op's JAX name stack (``op_names``, parsed from the
  compiled program's HLO text): ``transpose(jvp(…))`` backward, ``jvp(…)`` forward, the optimizer
  under ``cond`` (``optax.apply_if_finite``);
* busy time (the union of the events' intervals) and the host gap: the steps' wall time minus busy.
"""

from __future__ import annotations

import collections
import gzip
import json
import pathlib
import re
import tempfile
import time

CATEGORIES = (  # (kind, pattern over "name hlo_op primitive"), the first that matches wins
    ("attention kernels (cuDNN, Pallas)", r"cudnn|fmha|flash|sdpa|pallas|mosaic|attention|attend"),
    ("matrix products", r"gemm|cublas|cutlass|nvjet|xmma|wgmma|matmul|(^|[^\w])dot|convolution"),
    ("random bits", r"rng|threefry|philox|random"),
    ("copies, transposes, slices", r"memcpy|memset|copy|transpose|concatenate|slice|(^|[^a-z])pad"),
    ("reductions", r"reduc"),
    ("elementwise fusions", r"fusion"),
)
OTHER = "other"
DERIVED = ("XLA Modules", "XLA Ops", "XLA TraceMe", "Async XLA Ops", "Framework", "Source code",
           "Steps", "Launch Stats", "TensorFlow")  # fmt: skip


def kind_of(text: str) -> str:
    for kind, pattern in CATEGORIES:
        if re.search(pattern, text, re.IGNORECASE):
            return kind
    return OTHER


def phase_of(op_name: str) -> str:
    if not op_name:
        return "unattributed"
    if "transpose(jvp" in op_name:
        return "backward"
    if "jvp(" in op_name:
        return "forward"
    if "/cond/" in op_name:
        return "optimizer"
    return "loss, gradient norm, other"


def _key(name: str) -> str:
    return re.sub(r"[._\-]", "_", name)


def op_names(hlo_text: str) -> dict[str, str]:
    """HLO instruction name -> the JAX name stack of its ``metadata`` (``op_name``), keyed with
    ``.``, ``-`` and ``_`` alike (kernel names write ``fusion_12`` for ``fusion.12``)."""
    pattern = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=.*?op_name=\"([^\"]*)\"")
    names = {}
    for line in hlo_text.splitlines():
        if match := pattern.match(line):
            names[_key(match.group(1))] = match.group(2)
    return names


def device_events(events: list[dict]) -> tuple[str, list[dict]]:
    """(where they came from, the ``X`` events of the device's work), as the module docstring says."""
    processes = {
        e["pid"]: str(e.get("args", {}).get("name", ""))
        for e in events
        if e.get("ph") == "M" and e.get("name") == "process_name"
    }
    threads = {
        (e["pid"], e.get("tid")): str(e.get("args", {}).get("name", ""))
        for e in events
        if e.get("ph") == "M" and e.get("name") == "thread_name"
    }
    complete = [e for e in events if e.get("ph") == "X" and "dur" in e and "ts" in e]
    devices = {
        p for p, name in processes.items() if name.startswith("/device:") and "CPU" not in name
    }
    on_device = [e for e in complete if e.get("pid") in devices]
    thread = lambda e: threads.get((e.get("pid"), e.get("tid")), "")  # noqa: E731
    streams = [e for e in on_device if thread(e).lower().startswith("stream")]
    if streams:
        return "device streams", streams
    ops = [e for e in on_device if thread(e) == "XLA Ops"]
    if ops:
        return "device XLA Ops line", ops
    if on_device:
        return "device", [e for e in on_device if not thread(e).startswith(DERIVED)]
    return "host XLA ops", [e for e in complete if "hlo_op" in (e.get("args") or {})]


def union_us(intervals: list[tuple[float, float]]) -> float:
    """The length of the union of ``(start, end)`` intervals."""
    total, end = 0.0, float("-inf")
    for a, b in sorted(intervals):
        if b <= end:
            continue
        total += b - max(a, end)
        end = b
    return total


def summarize(
    events: list[dict], *, steps: int, wall_us: float, names: dict[str, str] | None = None, top=12
) -> dict:
    """Device time a step, by kind, by phase and by kernel, and the host gap (``wall_us`` over
    ``steps``); every time in ms a step, shares of the summed event time."""
    source, chosen = device_events(events)
    names = names or {}
    kinds, phases = collections.Counter(), collections.Counter()
    kernels: dict[str, list] = {}
    for e in chosen:
        args = e.get("args") or {}
        hlo = str(args.get("hlo_op", ""))
        op = names.get(_key(hlo)) or names.get(_key(e["name"])) or ""
        kind = kind_of(f"{e['name']} {hlo} {op.rsplit('/', 1)[-1]}")
        dur = float(e["dur"])
        kinds[kind] += dur
        phases[phase_of(op)] += dur
        k = kernels.setdefault(e["name"], [0.0, 0, kind, op])
        k[0] += dur
        k[1] += 1
    total = sum(kinds.values())
    busy = union_us([(float(e["ts"]), float(e["ts"]) + float(e["dur"])) for e in chosen])
    per_step = lambda us: us / 1e3 / max(steps, 1)  # noqa: E731
    share = lambda us: us / total if total else None  # noqa: E731
    ranked = sorted(kernels.items(), key=lambda kv: -kv[1][0])[:top]
    return {
        "source": source, "events": len(chosen), "steps": steps,
        "wall_ms": per_step(wall_us), "busy_ms": per_step(busy), "summed_ms": per_step(total),
        "host_gap_ms": per_step(max(wall_us - busy, 0.0)),
        "kinds": [{"kind": k, "ms": per_step(v), "share": share(v)} for k, v in kinds.most_common()],
        "phases": [{"phase": p, "ms": per_step(v), "share": share(v)} for p, v in phases.most_common()],
        "kernels": [
            {"name": n[:90], "kind": kind, "ms": per_step(us), "calls": count / max(steps, 1),
             "op": op[-120:]}
            for n, (us, count, kind, op) in ranked
        ],
    }  # fmt: skip


def read_trace(folder: pathlib.Path) -> list[dict]:
    """The events of the newest ``*.trace.json.gz`` under ``folder``, else of its ``*.xplane.pb``."""

    def newest(pattern: str) -> list[pathlib.Path]:
        return sorted(pathlib.Path(folder).rglob(pattern), key=lambda p: p.stat().st_mtime)

    if found := newest("*.trace.json.gz"):
        with gzip.open(found[-1], "rt") as f:
            return json.load(f)["traceEvents"]
    if found := newest("*.xplane.pb"):
        return xplane_events(found[-1])
    written = sorted(p.name for p in pathlib.Path(folder).rglob("*") if p.is_file())
    raise FileNotFoundError(f"no trace written (found: {', '.join(written) or 'nothing'})")


def xplane_events(path: pathlib.Path) -> list[dict]:
    """An ``*.xplane.pb`` (``jax.profiler.ProfileData``) as trace events: planes as processes, lines
    as threads."""
    from jax.profiler import ProfileData

    events = []
    for pid, plane in enumerate(ProfileData.from_file(str(path)).planes, 1):
        events.append({"ph": "M", "name": "process_name", "pid": pid, "args": {"name": plane.name}})
        for tid, line in enumerate(plane.lines, 1):
            name = {"name": line.name}
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": name})
            events += [
                {"ph": "X", "pid": pid, "tid": tid, "name": e.name, "ts": e.start_ns / 1e3,
                 "dur": e.duration_ns / 1e3, "args": {k: str(v) for k, v in dict(e.stats).items()}}
                for e in line.events
            ]  # fmt: skip
    return events


def profile(step, steps: int = 5) -> dict:
    """``steps`` pipelined training steps of ``step`` (a ``bench.gpu.Step``) under the profiler,
    after two untraced ones; the summary of their trace, with the compile record."""
    import jax

    from bench.gpu_step import run_steps

    compiled, record = step.compile()
    state, batch, mems = step.inputs()
    *_, state, mems = run_steps(compiled, state, batch, mems, warmup=2, repeats=1)
    with tempfile.TemporaryDirectory() as folder:
        with jax.profiler.trace(folder):
            start = time.perf_counter()
            for _ in range(steps):
                state, mems, metrics = compiled(state, batch, mems)
            jax.block_until_ready((state, mems, metrics))
            wall = time.perf_counter() - start
        events = read_trace(pathlib.Path(folder))
    names = op_names(compiled.as_text())
    return {**record, **summarize(events, steps=steps, wall_us=wall * 1e6, names=names)}
