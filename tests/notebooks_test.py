"""Every notebook runs top to bottom in smoke mode (``SMOKE=1``: tiny sizes, seconds).

The code cells are executed in order in one fresh interpreter started in ``notebooks/``, as a
kernel would run them; no Jupyter needed. A failing cell fails the test with its traceback.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT

NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def test_there_are_notebooks():
    assert len(NOTEBOOKS) >= 3


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_notebook_runs_in_smoke_mode(path):
    cells = json.loads(path.read_text())["cells"]
    code = "\n\n".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
    assert "import relpos_jax" in code or "from relpos_jax" in code
    env = dict(os.environ, SMOKE="1", MPLBACKEND="Agg")
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=path.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert result.returncode == 0, result.stderr[-4000:]
