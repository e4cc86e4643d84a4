"""The command-line options that several benchmarks take, each defined once here.

Lists are comma-separated (``--schemes txl,rope``) and arrive as tuples. ``--set`` overrides read
as ``train.py``'s ``--config.<override>`` flags: scripts pass them on to ``train.py`` and ``eval.py``
that way, and to ``relpos_jax.config.load_config`` for the same config in process.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

from bench.measure import ROOT, SIZES
from relpos_jax.config import POSITIONS

DTYPES = ("float32", "bfloat16")


def parser(doc: str) -> argparse.ArgumentParser:
    """A script's parser, described by the first line of its docstring."""
    return argparse.ArgumentParser(description=doc.splitlines()[0])


def listed(kind: type = str, choices: Sequence | None = None) -> Callable[[str], tuple]:
    """An argparse ``type``: ``"a,b,c"`` as a tuple of ``kind`` values, each one of ``choices``."""

    def parse(text: str) -> tuple:
        values = tuple(kind(item) for item in text.split(",")) if text else ()  # "": none
        unknown = [str(v) for v in values if choices is not None and v not in choices]
        if unknown:
            known = ",".join(map(str, choices))
            raise argparse.ArgumentTypeError(f"{','.join(unknown)}: choose from {known}")
        return values

    parse.__name__ = f"comma-separated {kind.__name__}"  # argparse's "invalid ... value" message
    return parse


ints = listed(int)


def add_schemes(
    parser: argparse.ArgumentParser,
    default: Sequence[str] | None = POSITIONS,
    help: str = "position schemes",
) -> None:
    """``--schemes a,b,...``, names from the model's ``POSITIONS``; ``default`` None: unset."""
    parser.add_argument(
        "--schemes",
        type=listed(choices=POSITIONS),
        default=",".join(default) if default else None,
        metavar="A,B,...",
        help=f"{help}, from {','.join(POSITIONS)} (default: %(default)s)",
    )


def add_overrides(parser: argparse.ArgumentParser, help: str = "applied to every run") -> None:
    """``--set section.field=value``, repeatable: config overrides as ``train.py`` reads them."""
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help=f"a config override, as train.py's --config.SECTION.FIELD=VALUE; {help}",
    )


def add_runs(parser: argparse.ArgumentParser, default: str, help: str = "") -> None:
    """``--runs DIR``: where the training runs are kept (``default`` under the repository)."""
    more = f"; {help}" if help else ""
    parser.add_argument(
        "--runs", default=str(ROOT / default), help=f"where the runs are kept{more}"
    )


def add_out(parser: argparse.ArgumentParser, default: str = "docs/benchmarks") -> None:
    """``--out DIR``: where tables and plots are written (``default`` under the repository: the
    benchmarks' docs/benchmarks, the research sweeps' docs/results)."""
    parser.add_argument("--out", default=str(ROOT / default), help="where the results are written")


def add_size(parser: argparse.ArgumentParser, default: str = "small", many: bool = False) -> None:
    """``--size``: one of ``measure.SIZES`` (``many``: a comma-separated list of them)."""
    if many:
        kind, help = listed(choices=tuple(SIZES)), f"from {','.join(SIZES)} (default: %(default)s)"
        parser.add_argument("--size", type=kind, default=default, metavar="A,B,...", help=help)
    else:
        parser.add_argument("--size", choices=tuple(SIZES), default=default)


def add_dtypes(parser: argparse.ArgumentParser, default: str) -> None:
    parser.add_argument(
        "--dtypes",
        type=listed(choices=DTYPES),
        default=default,
        metavar="A,B",
        help=f"from {','.join(DTYPES)} (default: %(default)s)",
    )


def add_timing(
    parser: argparse.ArgumentParser,
    repeats: int | None = None,
    warmup: int | None = None,
    rounds: int | None = None,
    rounds_help: str = "rounds, the compared runs alternating; medians over the rounds",
) -> None:
    """``--repeats``, ``--warmup`` and ``--rounds``: those given a default."""
    if repeats is not None:
        parser.add_argument(
            "--repeats", type=int, default=repeats, help="timed calls a measurement"
        )
    if warmup is not None:
        parser.add_argument("--warmup", type=int, default=warmup, help="untimed calls first")
    if rounds is not None:
        parser.add_argument("--rounds", type=int, default=rounds, help=rounds_help)
