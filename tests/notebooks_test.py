"""Every notebook runs top to bottom in smoke mode (``SMOKE=1``: tiny sizes, seconds) and computes
what it says it computes.

The code cells are executed in order in one fresh interpreter started in ``notebooks/``, as a
kernel would run them; no Jupyter needed. A failing cell fails the test with its traceback. After
the last cell, a few lines written here read the notebook's own variables (its results, its
figures) into a JSON report, and the test asserts on those values.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import numpy as np
import pytest

from relpos_jax.config import RELATIVE_POSITIONS
from tests.helpers import ROOT

NOTEBOOKS = {path.stem: path for path in sorted((ROOT / "notebooks").glob("*.ipynb"))}

# Appended after a notebook's last cell: writes the dict ``report`` to $NOTEBOOK_REPORT.
_DUMP = """
import json as _json
with open(os.environ["NOTEBOOK_REPORT"], "w") as _file:
    _json.dump(report, _file)
"""

# A figure written by ``viz.save`` is a PNG: its first bytes, its size, and Pillow-free dimensions.
_PNG = """
def _png(path):
    with open(path, "rb") as file:
        head = file.read(24)
    return {"magic": head[:8].hex(), "width": int.from_bytes(head[16:20], "big"),
            "height": int.from_bytes(head[20:24], "big")}
"""
PNG_MAGIC = b"\x89PNG\r\n\x1a\n".hex()


def run_notebook(stem: str, report_code: str, tmp_path) -> dict:
    """Run notebook ``stem`` in smoke mode, then ``report_code`` (which sets ``report``); the report."""
    cells = json.loads(NOTEBOOKS[stem].read_text())["cells"]
    code = "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert "import relpos_jax" in code or "from relpos_jax" in code
    report_path = tmp_path / "report.json"
    env = dict(os.environ, SMOKE="1", MPLBACKEND="Agg", NOTEBOOK_REPORT=str(report_path))
    result = subprocess.run(
        [sys.executable, "-c", "\n\n".join([code, _PNG, report_code, _DUMP])],
        cwd=NOTEBOOKS[stem].parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    return json.loads(report_path.read_text())


POSITION_ENCODINGS = """
report = {
    "schemes": list(biases),
    "shapes": {s: list(b.shape) for s, b in biases.items()},
    "finite": {s: bool(np.isfinite(b).all()) for s, b in biases.items()},
    "alibi": biases["alibi"].tolist(),
    "alibi_slopes": np.asarray(P.alibi_slopes(4)).tolist(),
    "t5": biases["t5"].tolist(),
    "distances": distances.tolist(),
    "figures": {name: _png(os.path.join(OUT, name))
                for name in ("bias_vs_distance.png", "learned_bias_vs_distance.png", "rope.png")},
    "rope_axes": len(fig.axes),
    "ramp": ramp.tolist(),
    "learned": {s: b.tolist() for s, b in learned.items()},
    "learned_sources": sources,
    "far": far.tolist(),
}
"""

MEMORY_AND_RECURRENCE = """
report = {
    "scan_minus_one_pass": float(jnp.abs(scanned - whole).max()),
    "weights_shape": list(weights.shape),
    "row_sums": weights.sum(-1).tolist(),
    "unwritten_slots_max": float(weights[:, :32].max()),
    "written_slots_max": float(weights[:, 32:48].max()),
    "future_keys_max": float(max(weights[i, 48 + i + 1 :].max(initial=0.0) for i in range(16))),
    "map_images": [list(image.get_array().shape) for image in toy_ax.images],
    "trained_source": source,
    "memory_share": memory_share,
    "trained_maps": [list(a.images[0].get_array().shape) for a in fig_maps.axes if a.images],
    "first_position": first,
    "needle": {f"{s}/{c}": np.mean(v, axis=0).tolist() for (s, c), v in accuracy.items()},
    "needle_lines": [len(a.lines) for a in fig.axes],
}
"""

LENGTH_EXTRAPOLATION = """
report = {
    "trained": list(trained),
    "lengths": lengths,
    "L": L,
    "table": table,
    "lines": [line.get_label() for line in table_fig.axes[0].lines],
    "attention": {n: w.tolist() for n, w in attention.items()},
    "count": count.tolist(),
}
"""


def test_every_notebook_is_checked():
    """A notebook added to notebooks/ needs a test below that asserts on what it computes."""
    assert sorted(NOTEBOOKS) == sorted(
        ["01_position_encodings", "02_memory_and_recurrence", "03_length_extrapolation"]
    )


@pytest.mark.slow
def test_position_encodings_notebook_draws_every_scheme(tmp_path):
    report = run_notebook("01_position_encodings", POSITION_ENCODINGS, tmp_path)
    schemes = [s for s in RELATIVE_POSITIONS if s != "none"]
    assert sorted(report["schemes"]) == sorted(schemes)  # every relative scheme with a bias
    distances = np.asarray(report["distances"])
    assert distances.tolist() == list(range(65))  # smoke size: d = 0 … 64
    assert all(report["shapes"][s] == [4, 65] for s in schemes)  # heads x distances
    assert all(report["finite"].values())
    slopes = np.asarray(report["alibi_slopes"])
    np.testing.assert_allclose(report["alibi"], -slopes[:, None] * distances, rtol=1e-6)
    np.testing.assert_allclose(slopes, [2**-2, 2**-4, 2**-6, 2**-8])  # Press et al., 4 heads
    t5 = np.asarray(report["t5"])
    assert len(np.unique(t5[0])) > 1 and np.all(t5[:, -1] == t5[:, -2])  # buckets, flat at the end
    for name, png in report["figures"].items():  # every figure written, as non-empty PNGs
        assert png["magic"] == PNG_MAGIC and png["width"] > 100 and png["height"] > 100, name
    assert report["rope_axes"] == 2  # wavelengths and YaRN's ramp
    ramp = np.asarray(report["ramp"])
    assert ramp.shape == (32,) and ramp.min() == 0.0 and ramp.max() == 1.0
    assert np.all(np.diff(ramp) <= 0)  # high frequencies kept (1), low ones interpolated (0)
    # Smoke mode trains each model here (no sweep checkpoint): 2 heads, distances 0 … 63.
    learned, far = report["learned"], np.asarray(report["far"])
    assert far.tolist() == list(range(64))
    assert sorted(learned) == sorted(["t5", "alibi", "kerple", "shaw", "deberta", "txl", "rope"])
    assert all(np.asarray(b).shape == (2, 64) and np.isfinite(b).all() for b in learned.values())
    assert set(report["learned_sources"].values()) == {"trained here for 5 steps"}
    slopes = [2**-4, 2**-8]  # ALiBi has nothing to learn: the trained model's bias is −slope·d
    np.testing.assert_allclose(learned["alibi"], -np.asarray(slopes)[:, None] * far, rtol=1e-6)
    t5 = np.asarray(learned["t5"])
    assert np.all(t5[:, -1] == t5[:, -2])  # T5's last bucket, flat beyond max_distance


@pytest.mark.slow
def test_memory_and_recurrence_notebook_finds_the_recurrence_exact(tmp_path):
    report = run_notebook("02_memory_and_recurrence", MEMORY_AND_RECURRENCE, tmp_path)
    assert report["scan_minus_one_pass"] < 1e-5  # 3 segments with memory = one pass
    assert report["weights_shape"] == [16, 64]  # 16 queries, 48 memory slots + 16 keys
    np.testing.assert_allclose(report["row_sums"], 1.0, rtol=1e-5)
    assert report["unwritten_slots_max"] == 0.0  # 32 slots never written
    assert report["written_slots_max"] > 0.0  # the 16 written ones are read
    assert report["future_keys_max"] == 0.0  # causal within the segment
    assert report["map_images"] == [[16, 64]]  # the map shows those weights
    # The trained model (smoke: 1 layer trained here, memory 64 of which 16 written, 16 queries).
    assert report["trained_source"] == "trained here for 5 steps"
    assert len(report["memory_share"]) == 1 and 0.0 < report["memory_share"][0] < 1.0
    assert report["trained_maps"] == [[16, 80]]
    # From the committed sweep JSONs: the loss by position and the needle probe's accuracy.
    ablation = json.loads((ROOT / "docs/results/earlier/ablation.json").read_text())
    for scheme, by_memory in report["first_position"].items():  # position 1, mean over seeds
        for memory, value in by_memory.items():
            runs = [
                r for r in ablation["runs"] if (r["scheme"], str(r["memory"])) == (scheme, memory)
            ]
            assert value == round(float(np.mean([r["bpc_by_position"][0] for r in runs])), 3)
    probe = json.loads((ROOT / "docs/results/probe_needle.json").read_text())
    first = probe["runs"][0]
    key = f"{first['scheme']}/{first['condition']}"
    runs = [r for r in probe["runs"] if (r["scheme"], r["condition"]) == tuple(key.split("/"))]
    expected = np.mean([[c["byte_accuracy"] for c in r["curve"]] for r in runs], axis=0)
    np.testing.assert_allclose(report["needle"][key], expected)
    schemes = [{r["scheme"] for r in probe["runs"] if r["condition"] == c} for c in
               probe["settings"]["conditions"]]  # fmt: skip
    assert report["needle_lines"] == [len(s) + 1 for s in schemes]  # + chance


@pytest.mark.slow
def test_length_extrapolation_notebook_scores_every_scheme_and_rope_extension(tmp_path):
    report = run_notebook("03_length_extrapolation", LENGTH_EXTRAPOLATION, tmp_path)
    schemes = ["alibi", "rope", "t5"]
    extensions = [f"rope+{kind}" for kind in ("linear", "ntk", "dynamic", "yarn", "llama3")]
    assert report["trained"] == schemes
    L, lengths = report["L"], report["lengths"]
    assert L == 16 and lengths == [L, 2 * L]
    table = report["table"]
    assert list(table) == schemes + extensions
    bpc = np.asarray(list(table.values()))
    assert bpc.shape == (8, 2) and np.all(np.isfinite(bpc))
    assert np.all((bpc > 0) & (bpc < 8))  # below uniform over 256 bytes
    for name in extensions:
        assert table[name][0] == table["rope"][0]  # at the trained length no scaling is applied
        assert table[name][1:] != table["rope"][1:]  # beyond it, the scaling changes the scores
    assert report["lines"] == list(table)  # one curve a row
    attention = {name: np.asarray(w) for name, w in report["attention"].items()}
    assert list(attention) == ["rope", *extensions]
    assert report["count"] == list(range(2 * L, 0, -1))  # pairs d apart in a window of 2L
    for w in attention.values():  # mean weights by distance: each query's weights sum to 1
        assert w.shape == (2 * L,) and np.all(w >= 0) and np.all(w <= 1)
        np.testing.assert_allclose((w * np.asarray(report["count"])).sum(), 2 * L, rtol=1e-4)
    for name in extensions:  # stretched beyond the trained length, each moves the weights
        assert not np.allclose(attention[name], attention["rope"])
