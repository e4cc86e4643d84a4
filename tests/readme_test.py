"""The README as a front door: short, every link resolving, its leaderboard rows the leaderboard's,
its library example running, and its scheme the scheme's file, whole."""

from __future__ import annotations

import itertools
import re

from tests.helpers import ROOT

README = (ROOT / "README.md").read_text()


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, re.S)


def test_the_readme_is_a_front_door():
    assert len(README.splitlines()) < 150
    for section in ("## Two commands", "## Results", "## As a library", "## Add a scheme"):
        assert section in README


def test_every_link_of_the_readme_and_the_docs_resolves():
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        for target in re.findall(r"\]\(([^)#\s]+)", page.read_text()):
            if not target.startswith("http"):
                assert (page.parent / target).exists(), f"{page.name}: {target}"


def test_its_leaderboard_rows_are_the_leaderboards():
    leaderboard = (ROOT / "docs/results/README.md").read_text().splitlines()
    header = "| scheme | memory | test bpc |"
    start = next(i for i, line in enumerate(README.splitlines()) if line.startswith(header))
    rows = list(itertools.takewhile(lambda line: line.startswith("|"), README.splitlines()[start:]))
    assert len(rows) >= 7  # the header, its rule and at least five schemes' rows
    assert all(row in leaderboard for row in rows)


def test_its_scheme_is_the_file_whole():
    [scheme] = [block for block in _blocks("python") if "@register" in block]
    source = (ROOT / "relpos_jax/schemes/alibi.py").read_text()
    assert scheme in source


def test_its_library_example_runs():
    [example] = [block for block in _blocks("python") if "TransformerLM(" in block]
    namespace: dict = {}
    exec(compile(example, "README.md", "exec"), namespace)
    assert namespace["tokens"].shape == (1, 20)  # the new tokens


def test_its_first_commands_figures_are_the_measured_ones():
    import json

    measured = json.loads((ROOT / "docs/results/txl_small.json").read_text())
    assert f"valid bpc {measured['valid_bpc']:.4f}, test bpc {measured['test_bpc']:.4f}" in README
    assert f"valid bpc {measured['valid_bpc']:.4f} over" in README  # the sample output
    assert (
        f"`{measured['settings']['partition']}`" in (ROOT / "docs/results/txl_small.md").read_text()
    )
