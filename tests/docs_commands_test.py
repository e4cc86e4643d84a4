"""Every ``python -m <module>`` that README.md, docs/ and the Makefile name exists and answers
``--help``.

One subprocess checks them all (``CHECK``): the project's modules whose entry point parses its
command line with argparse run as ``__main__`` with ``--help`` and must exit 0 having printed their
usage; a project module with no command line (``relpos_jax.analysis.demo``, which runs its tour
whatever it is given) is imported, not run; a module from elsewhere (``pytest``) is only found.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys

from tests.helpers import ROOT

OURS = ("bench", "experiments", "relpos_jax", "configs")  # the repository's packages
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), ROOT / "Makefile"]
# A module name, whole: "python -m bench.<name>" names none.
COMMAND = re.compile(r"(?:python|\$\(PY\)) -m ([A-Za-z_][\w.]*\w)(?![\w.<])")

CHECK = r"""
import contextlib, importlib, importlib.util, io, json, runpy, sys

modules, ours = json.loads(sys.argv[1]), tuple(json.loads(sys.argv[2]))
answers = {}
for name in modules:
    try:
        spec = importlib.util.find_spec(name)
    except ImportError as error:
        spec, answers[name] = None, f"not found: {error}"
    if spec is None:
        answers.setdefault(name, "not found")
        continue
    if name.split(".")[0] not in ours:
        answers[name] = "ok"
        continue
    main = importlib.util.find_spec(name + ".__main__") if spec.submodule_search_locations else spec
    source = main.loader.get_source(main.name) if main else ""
    if "parse_args" not in (source or ""):  # no command line: importing it is the check
        try:
            importlib.import_module(name)
            answers[name] = "ok"
        except Exception as error:
            answers[name] = f"import failed: {type(error).__name__}: {error}"
        continue
    sys.argv, printed = [name, "--help"], io.StringIO()
    try:
        with contextlib.redirect_stdout(printed), contextlib.redirect_stderr(io.StringIO()):
            runpy.run_module(name, run_name="__main__", alter_sys=True)
        answers[name] = "ran without exiting: --help was not read"
    except SystemExit as done:
        usage = "usage:" in printed.getvalue()
        answers[name] = "ok" if done.code in (0, None) and usage else f"exit {done.code}"
    except Exception as error:
        answers[name] = f"{type(error).__name__}: {error}"
print(json.dumps(answers))
"""


def named_modules() -> dict[str, list[str]]:
    """Each module a page names after ``python -m`` (the Makefile: ``$(PY) -m``), with the pages
    that name it."""
    named: dict[str, list[str]] = {}
    for page in PAGES:
        for module in COMMAND.findall(page.read_text()):
            named.setdefault(module, []).append(str(page.relative_to(ROOT)))
    return named


def test_the_pages_name_the_sweeps_and_benchmarks_by_their_packages():
    named = named_modules()
    assert {"experiments.ablation", "experiments.core", "bench.speed"} <= set(named)
    sweeps = ("ablation", "compare_training", "core", "extrapolation", "leaderboard",
              "learning_curve", "papers", "probes", "recl", "sweep", "txl_small")  # fmt: skip
    moved = [m for m in named if m.partition(".")[::2] in (("bench", s) for s in sweeps)]
    assert not moved, f"research sweeps named under bench: {moved}"


def test_every_module_the_docs_run_exists_and_answers_help():
    named = named_modules()
    result = subprocess.run(
        [sys.executable, "-c", CHECK, json.dumps(sorted(named)), json.dumps(OURS)],
        capture_output=True, text=True, cwd=ROOT, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    answers = json.loads(result.stdout.strip().splitlines()[-1])
    wrong = {
        f"{m} ({', '.join(sorted(set(named[m])))})": a for m, a in answers.items() if a != "ok"
    }
    assert not wrong, wrong
