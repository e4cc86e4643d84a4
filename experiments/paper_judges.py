"""The judges of ``experiments.papers``: how each kind of claim is decided on the sweeps' JSONs.

A judge takes the results by file name and ``contains`` (whether a commit holds another) and returns
a ``Verdict``: agrees / disagrees where the runs order the two sides by the sweeps' rule
(``compare.Compare``), not resolved where they do not separate them, not comparable where they
measured something else (a former implementation: ``CHANGES``) or nothing yet.
"""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from collections.abc import Callable

from experiments import ablation
from experiments.compare import Compare

# The extrapolation sweeps a claim may read: the first test tokens at 1–128×, and the whole test
# split at 512× (``docs/results/extrapolation_32k_whole``).
EXTRAPOLATION = "extrapolation.json"
WHOLE_SPLIT = "extrapolation_32k_whole/extrapolation.json"

# What changed a measurement's meaning since: a JSON measured at a commit that does not contain
# ``commit`` measured the former version.
CHANGES = {
    "partition": ("5db85fa", "on the former hash split of the corpus"),
    "kerple": ("8a0feb0", "with the former KERPLE (per layer, a forward clamp)"),
    "fire": ("d92df9f", "with the former FIRE (L = 512, w1 ~ N(0, 1), L learned directly)"),
}


@dataclasses.dataclass(frozen=True)
class Verdict:
    verdict: str  # agrees | disagrees | not resolved | not comparable
    ours: str  # this project's figures, as measured
    why: str = ""


@dataclasses.dataclass(frozen=True)
class Claim:
    source: str  # paper, table
    claim: str
    paper: str  # the published figures
    judge: Callable[[dict, Callable[[str, str], bool]], Verdict]  # (results by file, contains)
    scale: str = ""  # what differs in scale that bears on it, said where the runs disagree


def order(
    a: list[float], b: list[float], names: tuple[str, str], windows=None, digits: int = 4
) -> Verdict:
    """Whether ``a`` lies below ``b`` (a paper's "a is better": lower bpc), by the sweeps' rule
    (``compare.Compare``: the paired bootstrap where ``windows``, the two sides' windows of each
    seed, are all kept, paired on the blocks the two sides share where they were scored in other
    windows of the same tokens, e.g. at two lengths; else the spread rule)."""
    if not a or not b:
        return Verdict("not comparable", "not measured", "the sweep has not run this pair")
    compare = Compare({0: a, 1: b}, dict(enumerate(windows)) if windows else None,
                      shared_blocks=True)  # fmt: skip
    text = (
        f"{names[0]} {compare.cell(0, digits)} vs {names[1]} {compare.cell(1, digits)} "
        f"({_seeds(min(len(a), len(b)))})"
    )
    if not compare.apart(0, 1):
        why = "the paired interval of the difference holds zero" if compare.bootstrap else (
            "one seed on a side: no claim" if min(len(a), len(b)) < 2
            else "within twice the larger seed spread"
        )  # fmt: skip
        return Verdict("not resolved", text, why)
    below = compare.mean(0) < compare.mean(1)
    return Verdict("agrees" if below else "disagrees", text + compare.difference_text(0, 1, digits))


def _seeds(n: int) -> str:
    return f"{n} seed{'' if n == 1 else 's'}"


def _runs(results: dict, scheme: str, memory: bool) -> list[dict]:
    """The ablation's (scheme, memory) runs, a seed each."""
    runs = results.get("ablation.json", {}).get("runs", [])
    return [r for r in runs if r["scheme"] == scheme and (r["memory"] > 0) == memory]


def _ablation(results: dict, scheme: str, memory: bool, field: str = "test_bpc") -> list:
    """Each seed's ``field`` of the ablation's (scheme, memory) runs (``test_windows``: None where
    a run kept none)."""
    return [r.get(field) for r in _runs(results, scheme, memory)]


def _extrapolated(
    results: dict, label: str, factor: int, field: str = "bpc", sweep: str = EXTRAPOLATION
) -> list:
    """Each seed's non-overlapping ``field`` of ``label`` at ``factor`` × the trained length in the
    extrapolation sweep ``sweep`` (``bpc_windows``: its windows, None where a run kept none)."""
    e = results.get(sweep)
    if e is None:
        return []
    length = str(e["settings"]["train_len"] * factor)
    return [
        (r.get(field) or {}).get("non-overlapping", {}).get(length)
        for r in e["runs"]
        if r["label"] == label and r["variant"] == "defaults"
        and length in r["bpc"]["non-overlapping"]
    ]  # fmt: skip


def _stale(results: dict, name: str, changes: tuple[str, ...], contains) -> tuple[list[str], str]:
    """The ``changes`` that ``name``'s JSON was measured before, and the sentence that says so
    ("" where it is current)."""
    measured = results.get(name, {}).get("settings", {}).get("commit")
    older = [c for c in changes if measured is not None and not contains(measured, CHANGES[c][0])]
    if not older:
        return [], ""
    said = ", ".join(f"{CHANGES[c][1]} ({CHANGES[c][0]})" for c in older)
    return older, f"measured at {measured} {said}"


def with_why(verdict: Verdict, stale: str) -> Verdict:
    return dataclasses.replace(verdict, why="; ".join(filter(None, (verdict.why, stale))))


def _label(scheme: str, memory: bool) -> str:
    return f"{scheme}, {'memory' if memory else 'none'}"


def table6_order(a: tuple[str, bool], b: tuple[str, bool], *, latter_half: bool = False):
    """``a``'s test bpc below ``b``'s, (scheme, memory?) each, in the ablation; ``latter_half``:
    on the latter half of each segment (``ablation.latter_half``: where a half-loss model
    trained)."""

    def judge(results: dict, contains) -> Verdict:
        names = (_label(*a), _label(*b))
        if latter_half:
            (va, wa), (vb, wb) = (ablation.latter_halves(_runs(results, *side)) for side in (a, b))
            verdict = order(va, vb, tuple(f"{name} (latter half)" for name in names), [wa, wb])
        else:
            windows = [_ablation(results, *side, field="test_windows") for side in (a, b)]
            verdict = order(_ablation(results, *a), _ablation(results, *b), names, windows)
        _, stale = _stale(results, "ablation.json", ("partition",), contains)
        return with_why(verdict, stale)

    return judge


def extrapolation_order(
    longer: tuple[str, int], shorter: tuple[str, int], changes=(), sweep: str = EXTRAPOLATION
):
    """``longer``'s bpc below ``shorter``'s (label, factor each) in the extrapolation sweep
    ``sweep``, e.g. ALiBi at 4× no worse than at 1×, by the paired bootstrap where both kept their
    windows (at two lengths: on the blocks of the same tokens that their windows share), else the
    spread rule; ``changes``: the implementations the claim depends on (``CHANGES``)."""

    def judge(results: dict, contains) -> Verdict:
        names = (f"{longer[0]} at {longer[1]}×", f"{shorter[0]} at {shorter[1]}×")
        windows = [
            _extrapolated(results, *side, "bpc_windows", sweep) for side in (longer, shorter)
        ]
        sides = [_extrapolated(results, *side, sweep=sweep) for side in (longer, shorter)]
        verdict = order(*sides, names, windows)
        older, stale = _stale(results, sweep, ("partition", *changes), contains)
        if set(older) & set(changes):  # a former implementation: another model than the paper's
            return Verdict("not comparable", verdict.ours, stale)
        return with_why(verdict, stale)

    return judge


def below_each(first: tuple[str, int], others: list[tuple[str, int]]):
    """``first``'s bpc below each of ``others``' (label, factor each, ``extrapolation_order``):
    agrees where every pair agrees; else disagrees where a pair does, not comparable where a pair
    is, and not resolved otherwise."""

    def judge(results: dict, contains) -> Verdict:
        verdicts = [extrapolation_order(first, other)(results, contains) for other in others]
        ours = "; ".join(dict.fromkeys(v.ours for v in verdicts))  # "not measured" once
        for outcome in ("disagrees", "not comparable", "not resolved"):
            if found := [v for v in verdicts if v.verdict == outcome]:
                return Verdict(outcome, ours, found[0].why)
        return Verdict("agrees", ours, "; ".join(filter(None, (v.why for v in verdicts))))

    return judge


def init_best_gain(scheme: str, memory: bool, *, gains: bool):
    """Whether a longer evaluation context than the trained one helps (``gains``) or does not help
    the ablation's (scheme, memory) runs: each seed's best − init interval in ``init_best.json``
    (``experiments.init_best``); agrees only where every seed says so."""

    def judge(results: dict, contains) -> Verdict:
        rows = [r for r in results.get("init_best.json", {}).get("runs", [])
                if r["scheme"] == scheme and (r["memory"] > 0) == memory]  # fmt: skip
        if not rows:
            return Verdict("not comparable", "not measured", "experiments.init_best has not run")
        beyond = sum(r["gain"][2] < 0 for r in rows)
        mean = [statistics.mean(r["bpc"][str(r[k])] for r in rows) for k in ("init", "best")]
        best = sorted({r["best"] for r in rows})
        ours = (f"{_label(scheme, memory)}: init {mean[0]:.4f} → best {mean[1]:.4f} at "
                f"c = {', '.join(map(str, best))} ({_seeds(len(rows))})")  # fmt: skip
        why = f"best below init beyond chance in {beyond} of {len(rows)} seeds (95% intervals)"
        if gains:  # (best is never above init: the claim holds or is not shown)
            verdict = "agrees" if beyond == len(rows) else "not resolved"
        else:
            verdict = (
                "agrees" if beyond == 0 else "disagrees" if beyond == len(rows) else "not resolved"
            )
        _, stale = _stale(results, "init_best.json", ("partition",), contains)
        return with_why(Verdict(verdict, ours, why), stale)

    return judge


RECL_ORDER = (("txl", True), ("shaw", True), ("txl", False), ("sinusoid", False))  # Table 8's


def _recl_pair(rows: list[dict], a: str, b: str) -> int:
    """+1 where every seed's group puts ``a``'s RECL interval (r = 0.1) above ``b``'s, −1 where
    every seed's puts it below, 0 otherwise (the intervals overlap in some seed)."""
    by_seed: dict = {}
    for row in rows:
        by_seed.setdefault(row["seed"], {})[row["label"]] = row["recl_interval"]["0.1"]
    sides = [(seed[a], seed[b]) for seed in by_seed.values() if a in seed and b in seed]
    if sides and all(lo_a > hi_b for (lo_a, _), (_, hi_b) in sides):
        return 1
    if sides and all(hi_a < lo_b for (_, hi_a), (lo_b, _) in sides):
        return -1
    return 0


def recl_order(results: dict, contains) -> Verdict:
    """Table 8's order, pair by pair down the paper's ranking, by each seed's bootstrap intervals."""
    r = results.get("recl.json")
    if r is None:
        return Verdict("not comparable", "not measured", "experiments.recl has not run")
    labels = {}
    for run in r["runs"]:
        side = (run.get("scheme"), run.get("mem_len", 0) > 0)
        if side in RECL_ORDER:
            labels.setdefault(side, run["label"])
    by_label: dict[str, list[float]] = {}
    for run in r["runs"]:
        if run["label"] in labels.values():
            by_label.setdefault(run["label"], []).append(run["recl"]["0.1"])
    shown = ", ".join(f"{k} {statistics.mean(v):.0f}" for k, v in by_label.items())
    if "group" not in r["settings"]:  # the protocol before Dai et al.'s group and fixed Δ
        return Verdict(
            "not comparable", shown, "measured with every ablation model as one group and a "
            "doubling grid of contexts, not the paper's group of four and fixed Δ",
        )  # fmt: skip
    if r.get("protocol", 0) < 3:
        return Verdict("not comparable", shown, "the vanilla model was scored in windows past "
                       "its trained length (positions it never saw)")  # fmt: skip
    if len(labels) < len(RECL_ORDER):
        return Verdict("not comparable", shown, "the group lacks some of Table 8's four models")
    ranked = [labels[side] for side in RECL_ORDER]
    pairs = [(a, b, _recl_pair(r["runs"], a, b)) for a, b in itertools.pairwise(ranked)]
    said = "; ".join(f"{a} {('above', 'not apart from', 'below')[1 - sign]} {b}"
                     for a, b, sign in pairs)  # fmt: skip
    why = f"each seed's 95% intervals: {said}"
    if any(sign < 0 for *_, sign in pairs):
        return Verdict("disagrees", shown, why)
    return Verdict("agrees" if all(sign > 0 for *_, sign in pairs) else "not resolved", shown, why)
