"""This project against the papers, claim by claim: rendered from the sweeps' JSONs in
``docs/results`` and the published figures below (``../shared/REFERENCES.md`` holds their sources).

    .venv/bin/python -m experiments.papers [--results docs/results] [--out docs/results]

Each claim a paper makes is checked on this project's runs of the same comparison, and judged:

- **agrees** / **disagrees**: the runs order the two sides as the paper does, or the other way,
  by the rule of the sweep's own tables (``compare.Compare``: the bootstrap interval of the paired
  difference excludes zero where the runs kept windows, else the means differ by more than twice the
  larger seed spread);
- **not resolved**: the runs do not separate the two sides by that rule;
- **not comparable**: the runs measured something else (an implementation or protocol that has
  changed since, named with the commit that changed it) or nothing yet.

The scales differ, and the table says how: the papers train word- or token-level models of 100M+
parameters for 100k+ steps; these runs are byte-level, millions of parameters, minutes on a CPU. A
claim about an ordering can carry over; a number cannot, so numbers are never compared, only
orders. Writes ``papers.md`` in ``--out``.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import pathlib
import statistics
import subprocess
from collections.abc import Callable

from bench import args as options
from bench.measure import ROOT
from experiments import ablation, sweep
from experiments.compare import Compare
from experiments.extrapolation import PI_LABEL

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
    seed, are all kept; else the spread rule)."""
    if not a or not b:
        return Verdict("not comparable", "not measured", "the sweep has not run this pair")
    compare = Compare({0: a, 1: b}, dict(enumerate(windows)) if windows else None)
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


def _extrapolated(results: dict, label: str, factor: int) -> list[float]:
    e = results.get("extrapolation.json")
    if e is None:
        return []
    length = str(e["settings"]["train_len"] * factor)
    return [
        r["bpc"]["non-overlapping"][length]
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


def _with_why(verdict: Verdict, stale: str) -> Verdict:
    return dataclasses.replace(verdict, why="; ".join(filter(None, (verdict.why, stale))))


def _label(scheme: str, memory: bool) -> str:
    return f"{scheme}, {'memory' if memory else 'none'}"


def _table6(a: tuple[str, bool], b: tuple[str, bool], *, latter_half: bool = False):
    """``a``'s test bpc below ``b``'s, (scheme, memory?) each, in the ablation; ``latter_half``:
    on the latter half of each segment (``ablation.latter_half``: where a half-loss model trained),
    by the spread rule over seeds."""

    def judge(results: dict, contains) -> Verdict:
        names = (_label(*a), _label(*b))
        if latter_half:
            halves = [[ablation.latter_half(r) for r in _runs(results, *side)] for side in (a, b)]
            sides = [[v for v in half if v is not None] for half in halves]
            verdict = order(*sides, tuple(f"{name} (latter half)" for name in names))
        else:
            windows = [_ablation(results, *side, field="test_windows") for side in (a, b)]
            verdict = order(_ablation(results, *a), _ablation(results, *b), names, windows)
        _, stale = _stale(results, "ablation.json", ("partition",), contains)
        return _with_why(verdict, stale)

    return judge


def _extrapolation(longer: tuple[str, int], shorter: tuple[str, int], changes=()):
    """``longer``'s bpc below ``shorter``'s (label, factor each), e.g. ALiBi at 4× no worse than
    at 1×; ``changes``: the implementations the claim depends on (``CHANGES``)."""

    def judge(results: dict, contains) -> Verdict:
        names = (f"{longer[0]} at {longer[1]}×", f"{shorter[0]} at {shorter[1]}×")
        verdict = order(_extrapolated(results, *longer), _extrapolated(results, *shorter), names)
        older, stale = _stale(results, "extrapolation.json", ("partition", *changes), contains)
        if set(older) & set(changes):  # a former implementation: another model than the paper's
            return Verdict("not comparable", verdict.ours, stale)
        return _with_why(verdict, stale)

    return judge


def _init_best(scheme: str, memory: bool, *, gains: bool):
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
        return _with_why(Verdict(verdict, ours, why), stale)

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


def _recl(results: dict, contains) -> Verdict:
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


def _untested(why: str):
    return lambda results, contains: Verdict("not comparable", "not measured", why)


CLAIMS = (
    Claim(
        "Transformer-XL, Table 6",
        "recurrence helps its relative encoding: TXL with memory below TXL without",
        "27.02 vs 29.59 ppl",
        _table6(("txl", True), ("txl", False)),
    ),
    Claim(
        "Transformer-XL, Table 6",
        "with recurrence, its encoding beats Shaw's",
        "27.02 vs 27.94 ppl",
        _table6(("txl", True), ("shaw", True)),
    ),
    Claim(
        "Transformer-XL, Table 6",
        "recurrence helps Shaw's encoding too",
        "27.94 vs 29.75 ppl",
        _table6(("shaw", True), ("shaw", False)),
    ),
    Claim(
        "Transformer-XL, Table 6",
        "without recurrence, relative (TXL) beats absolute sinusoids (trained on half loss; "
        "compared on the latter half of each segment, where that model trained)",
        "29.59 vs 30.97 ppl (half loss)",
        _table6(("txl", False), ("sinusoid+half", False), latter_half=True),
    ),
    Claim(
        "Transformer-XL, Table 6 (PPL init / best)",
        "with recurrence, its encoding gains from evaluating with a longer context than it trained "
        "with",
        "27.02 init → 26.77 best at attention length 500 (trained at 128)",
        _init_best("txl", True, gains=True),
    ),
    Claim(
        "Transformer-XL, Table 6 (PPL init / best)",
        "with recurrence, Shaw's encoding does not gain from a longer context",
        "27.94 init = 27.94 best (attention length 256)",
        _init_best("shaw", True, gains=False),
    ),
    Claim(
        "Transformer-XL, Table 6 (PPL init / best)",
        "without recurrence, its encoding gains from a longer context too",
        "29.59 init → 29.02 best at attention length 260",
        _init_best("txl", False, gains=True),
    ),
    Claim(
        "ALiBi, Table / Fig. 1 (WikiText-103, trained at 512)",
        "ALiBi extrapolates: 4× the trained length no worse than 1×",
        "19.73 at 512, 18.40 at 3,512 ppl",
        _extrapolation(("alibi", 4), ("alibi", 1)),
    ),
    Claim(
        "ALiBi, Table / Fig. 1",
        "sinusoids do not: 4× worse than 1×",
        "20.05 at 512, 178.97 at 3,512 ppl",
        _extrapolation(("sinusoid", 1), ("sinusoid", 4)),
    ),
    Claim(
        "ALiBi, Table / Fig. 1",
        "rotary degrades beyond its length: 4× worse than 1×",
        "20.07 at 512, 35.54 at 3,512 ppl",
        _extrapolation(("rope", 1), ("rope", 4)),
    ),
    Claim(
        "ALiBi, Table / Fig. 1",
        "at 16×, ALiBi below T5's buckets",
        "18.31 vs 64.94 ppl at 12,512 (24×)",
        _extrapolation(("alibi", 16), ("t5", 16)),
    ),
    Claim(
        "KERPLE, Table 3 (GitHub, trained at 512)",
        "at 32× the trained length the logarithmic kernel is below ALiBi",
        "KERPLE (log) 3.40 → 2.75, ALiBi 3.42 → 3.02 ppl from 512 to 16,384 (32×); "
        "OpenWebText2: 23.9 → 21.4 vs 23.9 → 22.5",
        _extrapolation(("kerple", 32), ("alibi", 32), ("kerple",)),
    ),
    Claim(
        "FIRE, Fig. 1 / Table 1 (C4, trained at 2,048)",
        "FIRE below KERPLE at 4–8× the trained length (here 8×)",
        "FIRE lowest of all at 8,192–16,384 (its figures)",
        _extrapolation(("fire", 8), ("kerple", 8), ("fire", "kerple")),
        "FIRE's paper trains at 2,048 tokens; here its MLP learns the bias over 64 positions, and "
        "past them it degrades, where KERPLE's logarithmic form carries on",
    ),
    Claim(
        "PI (Chen et al. 2023), Table 1",
        "a short fine-tune with interpolated positions makes the longer window useful: RoPE "
        "fine-tuned at 4× below RoPE at 1×",
        "LLaMA 7B 2,048 → 8,192 after 1,000 steps: ppl falls with the window",
        _extrapolation((PI_LABEL, 4), ("rope", 1)),
        "bytes and heads of 32 dims: interpolating by 4 puts neighbouring bytes a quarter of a "
        "position apart in every frequency, which the 400-step fine-tune at a tenth of the "
        "learning rate does not recover (LLaMA's tokens and 128-dim heads lose less)",
    ),
    Claim(
        "YaRN, Table 1",
        "YaRN at least as good as PI and NTK at the extended length",
        "3.35 vs 3.34 / 3.59 at 8,192 (fine-tuned)",
        _untested("the paper fine-tunes every method; this sweep scores them zero-shot"),
    ),
    Claim(
        "Transformer-XL, Table 8",
        "RECL: TXL > with Shaw > without recurrence > vanilla",
        "700 > 400 > 300 > 128 (r = 0.1)",
        _recl,
    ),
)


def contains(commit: str, ancestor: str) -> bool:
    """Whether ``commit`` has ``ancestor`` in its history (git; False where either is unknown)."""
    result = subprocess.run(
        ["git", "merge-base", "--is-ancestor", ancestor, commit], cwd=ROOT, capture_output=True
    )
    return result.returncode == 0


def judge_all(results: dict, contains=contains) -> list[tuple[Claim, Verdict]]:
    """Each claim and its verdict; a disagreement says what differs in scale (``Claim.scale``)."""
    judged = []
    for claim in CLAIMS:
        verdict = claim.judge(results, contains)
        if verdict.verdict == "disagrees" and claim.scale:
            verdict = _with_why(verdict, f"at this scale: {claim.scale}")
        judged.append((claim, verdict))
    return judged


def render(results: dict, contains=contains) -> str:
    a = results.get("ablation.json", {}).get("settings", {})
    e = results.get("extrapolation.json", {}).get("settings", {})
    lines = [
        "# This project against the papers",
        "",
        "Command: `python -m experiments.papers`, from the sweeps' JSONs beside this file. Each claim is "
        "judged on this project's runs of the same comparison: agrees / disagrees where the runs "
        "order the two sides by the sweeps' rule (twice the larger seed spread, or a bootstrap "
        "interval where runs kept windows), not resolved where they do not separate them, not "
        "comparable where the runs measured something else or nothing yet. Orders are compared, "
        "never numbers.",
        "",
        "Scale: the papers train word- or token-level models of 100M+ parameters for 100k+ "
        f"steps; here bytes of the embedded corpus{_scale(a, e)}.",
        "",
        "| source | claim | paper | here | verdict | why |",
        "|---|---|---|---|---|---|",
    ]
    judged = judge_all(results, contains)
    for claim, v in judged:
        lines.append(
            f"| {claim.source} | {claim.claim} | {claim.paper} | {v.ours} | **{v.verdict}** | "
            f"{v.why} |"
        )
    counts = collections.Counter(v.verdict for _, v in judged)
    lines += ["", "Tally: " + ", ".join(f"{n} {k}" for k, n in counts.items()) + "."]
    return "\n".join([*lines, ""])


def _scale(a: dict, e: dict) -> str:
    """What the runs were: the ablation's sizes and steps, the extrapolation's training."""
    parts = [f"the ablation {_sets(a)} for {a['steps']} steps"] if a else []
    if e:
        parts.append(f"the extrapolation trained at {e['train_len']} for {e['steps']} steps, "
                     "without memory")  # fmt: skip
    return (", " + ", ".join(parts)) if parts else ""


def _sets(settings: dict) -> str:
    sets = [s.removeprefix("model.").removeprefix("data.") for s in settings.get("sets", [])]
    return f"({', '.join(sets)})" if sets else "(txl_small's sizes)"


def gather(results_dir: pathlib.Path) -> dict:
    names = ("ablation.json", "extrapolation.json", "recl.json", "init_best.json",
             "probe_needle.json")  # fmt: skip
    loaded = {name: sweep.load(results_dir / name) for name in names}
    return {name: results for name, results in loaded.items() if results is not None}


def main() -> None:
    parser = options.parser(__doc__)
    parser.add_argument("--results", default=str(ROOT / "docs" / "results"))
    options.add_out(parser, "docs/results")
    args = parser.parse_args()
    table = render(gather(pathlib.Path(args.results)))
    out = pathlib.Path(args.out)
    out.mkdir(parents=True, exist_ok=True)  # as the sweeps make theirs
    (out / "papers.md").write_text(table)
    print(table)


if __name__ == "__main__":
    main()
