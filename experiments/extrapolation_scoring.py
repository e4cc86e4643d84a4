"""Scoring one run of ``experiments.extrapolation`` at longer evaluation lengths: its test bpc and
evaluation windows under each protocol, kept in the run's folder as they are measured.

A run's rows (``labels_of``): its scheme, and for RoPE each length extension applied at evaluation.
Each (row, protocol, length) cell keeps its bpc in the run's ``extrapolation_<digest>.json`` and its
windows (each segment row's, or each sliding window's, summed bits and scored tokens, as
``relpos_jax.evaluate`` returns them) in ``extrapolation_windows_<digest>.npz`` beside it, both
written whole and then renamed into place, the windows first; ``<digest>`` names the scoring
settings (tokens, stride, YaRN's β: ``cache_files``), so cells scored with other settings (the first
131,072 tokens, the whole split) stay side by side. A stopped sweep goes on from the next cell, and
the cell it was scoring from the blocks its pass kept (``pass_progress``: at most a minute of
scoring lost, where a pass at 32,768 over the whole split is an hour on a CPU); a cell
scored before windows were kept is scored again (``--scored-only`` tabulates it as it is), so that
every cell of the tables can carry a bootstrap interval, paired across the rows scored on the same
tokens (``experiments.compare``). Segments lie in rows of whole segments, each at a multiple of its
length in the text, so that two lengths pair on the longer one's windows; a cell whose segments do
not (``on_segment_grid``: rows of ceil(N / B) tokens, as scored before) is scored again too.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import pathlib
import time
from typing import NamedTuple

import numpy as np

from bench.measure import ROOT
from experiments import sweep
from experiments.extrapolation_tables import PROTOCOLS
from relpos_jax.config import load_config
from relpos_jax.eval_progress import PassProgress
from relpos_jax.files import replace_whole
from relpos_jax.positions.rope_stretch import STRETCHES, stretched, yarn_betas

ROPE_EXTENSIONS = STRETCHES  # each applied at evaluation: rows rope+linear, rope+ntk, …
LEGACY_CACHE = "extrapolation.json"  # one file for one key: written before the files were per key
LEGACY_WINDOWS_FILE = "extrapolation_windows.npz"


class Scored(NamedTuple):
    """One row's ``bpc`` and ``windows``, each ``{protocol: {L: …}}`` (windows where kept)."""

    bpc: dict[str, dict[str, float]]
    windows: dict[str, dict[str, dict]]


def measure(model, stream, length: int, protocols, args, progress=None) -> dict[str, dict]:
    """``evaluate``'s result (``bpc``, ``windows``, …) at evaluation length ``length`` under each of
    ``protocols``; ``progress``: ``{protocol: PassProgress}``, where the passes keep their progress
    (``pass_progress``)."""
    from relpos_jax.evaluate import evaluate, evaluate_sliding

    progress = progress or {}
    batch = max(1, args.batch_tokens // length)
    stride = min(args.stride or max(1, length // 2), length)
    tokens = args.tokens or None  # 0: the whole split
    scorers = {
        "non-overlapping": lambda: evaluate(  # rows of whole segments: lengths pair on blocks
            model,
            stream,
            batch_size=batch,
            segment_len=length,
            mem_len=0,
            max_tokens=tokens,
            whole_segments=True,
            progress=progress.get("non-overlapping"),
        ),
        "sliding": lambda: evaluate_sliding(
            model,
            stream,
            batch_size=batch,
            window=length,
            stride=stride,
            max_tokens=tokens,
            progress=progress.get("sliding"),
        ),
    }
    return {protocol: scorers[protocol]() for protocol in protocols}


def protocols_at(length: int, args) -> tuple[str, ...]:
    """The protocols scored at ``length``: sliding windows only up to ``--sliding-up-to``."""
    return PROTOCOLS if length <= args.sliding_up_to else PROTOCOLS[:1]


def labels_of(scheme: str) -> tuple[tuple[str, str | None], ...]:
    """``(label, RoPE extension)`` of the rows one run gives: its scheme, and for RoPE each
    extension applied at evaluation."""
    extensions = ROPE_EXTENSIONS if scheme == "rope" else ()
    return ((scheme, None), *((f"rope+{kind}", kind) for kind in extensions))


def _array_key(label: str, protocol: str, length: str) -> str:
    return f"{label}|{protocol}|{length}"


def scoring_key(args) -> dict:
    """The settings a run's cells were scored with (``cache_files``): tokens, stride, YaRN's β."""
    return {"tokens": args.tokens, "stride": args.stride, "yarn": yarn_betas(args.train_len)}


def cache_files(workdir: pathlib.Path, key: dict) -> tuple[pathlib.Path, pathlib.Path]:
    """The run's cells scored with the settings ``key``: (their bpc's JSON, their windows' npz)."""
    digest = hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]
    return workdir / f"extrapolation_{digest}.json", workdir / f"extrapolation_windows_{digest}.npz"


def _stored(workdir: pathlib.Path, key: dict) -> tuple[dict, pathlib.Path]:
    """What the run's folder keeps for ``key`` (its JSON, {} if none) and where its windows are:
    the files of ``key``, else the single pair written before the files were per key, if its key is
    ``key``."""
    cache, windows = cache_files(workdir, key)
    if not cache.exists() and (workdir / LEGACY_CACHE).exists():
        cache, windows = workdir / LEGACY_CACHE, workdir / LEGACY_WINDOWS_FILE
    stored = json.loads(cache.read_text()) if cache.exists() else {}
    return (stored if stored.get("key") == key else {}), windows


def pass_progress(workdir: pathlib.Path, cell: dict) -> PassProgress:
    """Where the pass that scores one cell keeps its progress until the cell is kept: a file of
    its own beside the run's cells, named by ``cell`` (the scoring settings, the row, protocol and
    length, the checkpoint's step and the attention), which a pass goes on from only if all of
    them, and the calls it is cut into, are the same."""
    name = json.dumps(cell, sort_keys=True)
    digest = hashlib.sha256(name.encode()).hexdigest()[:12]
    return PassProgress(workdir / f"extrapolation_pass_{digest}.npz", name)


def on_segment_grid(windows: dict, length: str) -> bool:
    """Whether segment windows (``{"tokens"}``, in the text's order) end at multiples of ``length``
    in the text, the last aside: as ``measure`` lays them out, so that they nest in those of any
    multiple of the length. Segments scored before (rows of ceil(N / B) tokens over the whole
    split) may end mid-grid; their cells are scored again."""
    ends = np.cumsum(np.asarray(windows["tokens"], np.int64))
    ends = np.unique(ends[ends > 0])
    return bool(np.all(ends[:-1] % int(length) == 0))


class _Cells:
    """A run's scored cells, ``{label: {protocol: {L: …}}}`` of bpc and of windows, as kept in its
    folder for these ``key`` settings (tokens, stride, YaRN's β), beside those of other settings."""

    def __init__(self, workdir: pathlib.Path, key: dict) -> None:
        self.workdir, self.key = pathlib.Path(workdir), key
        stored, found = _stored(self.workdir, key)
        self.bpc: dict = stored.get("bpc", {})
        self.windows: dict = {}
        layouts = stored.get("windows", {})
        arrays = dict(np.load(found)) if layouts and found.is_file() else {}
        for label, by_protocol in layouts.items():
            for protocol, by_length in by_protocol.items():
                for length, layout in by_length.items():
                    name = _array_key(label, protocol, length)
                    if f"{name}.bits" in arrays:
                        self._cell(self.windows, label, protocol)[length] = {
                            "bits": arrays[f"{name}.bits"],
                            "tokens": arrays[f"{name}.tokens"],
                            "layout": layout,
                        }

    @staticmethod
    def _cell(table: dict, label: str, protocol: str) -> dict:
        return table.setdefault(label, {p: {} for p in PROTOCOLS}).setdefault(protocol, {})

    def has(self, label: str, protocol: str, length: str, *, windows: bool) -> bool:
        """Whether the cell holds its bpc (and, with ``windows``, its windows too, on the segment
        grid where they are segments: ``on_segment_grid``)."""
        held = [self.bpc] + ([self.windows] if windows else [])
        if not all(length in t.get(label, {}).get(protocol, {}) for t in held):
            return False
        kept = self.windows[label][protocol][length] if windows else None
        return not (kept and protocol == "non-overlapping" and not on_segment_grid(kept, length))

    def put(self, label: str, protocol: str, length: str, bpc: float, windows: dict | None):
        self._cell(self.bpc, label, protocol)[length] = bpc
        if windows is not None:
            self._cell(self.windows, label, protocol)[length] = windows

    def save(self) -> None:
        """The windows, then the JSON that names them, each written whole and renamed into place (in
        ``key``'s own files: a legacy pair is left as it is)."""
        cache, windows_file = cache_files(self.workdir, self.key)
        arrays, layouts = {}, {}
        for label, by_protocol in self.windows.items():
            for protocol, by_length in by_protocol.items():
                for length, w in by_length.items():
                    name = _array_key(label, protocol, length)
                    arrays[f"{name}.bits"] = np.asarray(w["bits"], np.float64)
                    arrays[f"{name}.tokens"] = np.asarray(w["tokens"], np.int64)
                    self._cell(layouts, label, protocol)[length] = w["layout"]
        if arrays:
            replace_whole(windows_file, lambda f: np.savez_compressed(f, **arrays))
        text = json.dumps({"key": self.key, "bpc": self.bpc, "windows": layouts}, indent=1) + "\n"
        replace_whole(cache, lambda f: f.write(text.encode()))

    def scored(self, label: str, lengths: set[str]) -> Scored:
        """``label``'s cells at ``lengths``."""
        keep = lambda table: {  # noqa: E731
            p: {n: v for n, v in by_length.items() if n in lengths}
            for p, by_length in table.get(label, {p: {} for p in PROTOCOLS}).items()
        }
        return Scored(keep(self.bpc), keep(self.windows))


def score(run: sweep.Run, labels, lengths: list[int], args) -> dict[str, Scored]:
    """{label: ``Scored``} of one run at ``lengths`` for each ``(label, RoPE extension)`` of
    ``labels`` (``labels_of``: its scheme, and RoPE's extensions; the first, its own). Each cell is
    kept in the run's folder as soon as it is measured (``_Cells``), so a stopped sweep goes on
    from the next; ``--scored-only`` measures nothing."""
    from relpos_jax import data
    from relpos_jax.evaluate import restore_model, with_config

    cells = _Cells(run.workdir, scoring_key(args))
    own = labels[0][0]
    model, copied = None, False
    for label, kind in labels:
        for length in lengths:
            if kind is not None and length > args.train_len * args.extensions_up_to:
                continue  # beyond the factors the extensions are published for
            n = str(length)
            todo = [
                p for p in protocols_at(length, args) if not cells.has(label, p, n, windows=True)
            ]
            scaling = None if kind is None else stretched(kind, length / args.train_len,
                                                          args.train_len)  # fmt: skip
            if kind is not None and scaling is None:  # no stretch at the trained length: RoPE's
                for protocol in todo:
                    if cells.has(own, protocol, n, windows=False):
                        windows = cells.windows.get(own, {}).get(protocol, {}).get(n)
                        cells.put(label, protocol, n, cells.bpc[own][protocol][n], windows)
                        copied = True
                todo = []
            if not todo or args.scored_only:
                continue
            if model is None:
                config = load_config(ROOT / run.config, list(run.settings))
                model, cfg, step = restore_model(config, run.workdir)
                stream = data.open_data(cfg.data, "test")
            impl = "tiled" if length >= args.tiled_from else cfg.model.attention_impl
            model_config = dataclasses.replace(
                cfg.model, attention_impl=impl, rope_scaling=scaling or cfg.model.rope_scaling
            )
            cell = {
                **cells.key,
                "row": label,
                "length": n,
                "step": step,
                "attention": impl,
            }
            scored_model = with_config(model, model_config)
            start, measured = time.perf_counter(), {}
            for protocol in todo:  # each cell kept as soon as it is measured
                progress = {protocol: pass_progress(run.workdir, {**cell, "protocol": protocol})}
                measured |= measure(scored_model, stream, length, [protocol], args, progress)
                result = measured[protocol]
                cells.put(label, protocol, n, result["bpc"], result["windows"])
                cells.save()
                progress[protocol].done()
            seconds = time.perf_counter() - start
            values = " / ".join(f"{p} {r['bpc']:.4f}" for p, r in measured.items())
            print(f"  {run.name} {label} L={length}: {values} ({seconds:.0f} s)", flush=True)
    if copied and not args.scored_only:
        cells.save()  # the copies of RoPE's own cells at the trained length
    wanted = {str(n) for n in lengths}
    return {label: cells.scored(label, wanted) for label, _ in labels}
