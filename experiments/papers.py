"""This project against the papers, claim by claim: rendered from the sweeps' JSONs in
``docs/results`` and the published figures below (``../shared/REFERENCES.md`` holds their sources).

    .venv/bin/python -m experiments.papers [--results docs/results] [--out docs/results]

Each claim a paper makes is checked on this project's runs of the same comparison, and judged:

- **agrees** / **disagrees**: the runs order the two sides as the paper does, or the other way,
  by the rule of the sweep's own tables (``compare.Compare``: the bootstrap interval of the paired
  difference excludes zero where the runs kept windows, paired on the same tokens, at two lengths
  on the blocks of them that both lengths' windows end at; else the means differ by more than twice
  the larger seed spread);
- **not resolved**: the runs do not separate the two sides by that rule;
- **not comparable**: the runs measured something else (an implementation or protocol that has
  changed since, named with the commit that changed it) or nothing yet.

The scales differ, and the table says how: the papers train word- or token-level models of 100M+
parameters for 100k+ steps; these runs are byte-level, millions of parameters, minutes on a CPU. A
claim about an ordering can carry over; a number cannot, so numbers are never compared, only
orders. Writes ``papers.md`` in ``--out``; the judges are ``experiments.paper_judges``.
"""

from __future__ import annotations

import collections
import pathlib
import subprocess

from bench import args as options
from bench.measure import ROOT
from experiments import sweep
from experiments.extrapolation import PI_LABEL, fine_tuned_label, past_label
from experiments.paper_judges import (
    EXTRAPOLATION,
    WHOLE_SPLIT,
    Claim,
    Verdict,
    below_each,
    extrapolation_order,
    init_best_gain,
    order,
    recl_order,
    table6_order,
    with_why,
)

__all__ = ["CLAIMS", "PI_LABEL", "WHOLE_SPLIT", "Claim", "Verdict", "gather", "judge_all", "order",
           "render"]  # fmt: skip

CLAIMS = (
    Claim(
        "Transformer-XL, Table 6",
        "recurrence helps its relative encoding: TXL with memory below TXL without",
        "27.02 vs 29.59 ppl",
        table6_order(("txl", True), ("txl", False)),
    ),
    Claim(
        "Transformer-XL, Table 6",
        "with recurrence, its encoding beats Shaw's",
        "27.02 vs 27.94 ppl",
        table6_order(("txl", True), ("shaw", True)),
    ),
    Claim(
        "Transformer-XL, Table 6",
        "recurrence helps Shaw's encoding too",
        "27.94 vs 29.75 ppl",
        table6_order(("shaw", True), ("shaw", False)),
    ),
    Claim(
        "Transformer-XL, Table 6",
        "without recurrence, relative (TXL) beats absolute sinusoids (trained on half loss; "
        "compared on the latter half of each segment, where that model trained)",
        "29.59 vs 30.97 ppl (half loss)",
        table6_order(("txl", False), ("sinusoid+half", False), latter_half=True),
    ),
    Claim(
        "Transformer-XL, Table 6 (PPL init / best)",
        "with recurrence, its encoding gains from evaluating with a longer context than it trained "
        "with",
        "27.02 init → 26.77 best at attention length 500 (trained at 128)",
        init_best_gain("txl", True, gains=True),
    ),
    Claim(
        "Transformer-XL, Table 6 (PPL init / best)",
        "with recurrence, Shaw's encoding does not gain from a longer context",
        "27.94 init = 27.94 best (attention length 256)",
        init_best_gain("shaw", True, gains=False),
    ),
    Claim(
        "Transformer-XL, Table 6 (PPL init / best)",
        "without recurrence, its encoding gains from a longer context too",
        "29.59 init → 29.02 best at attention length 260",
        init_best_gain("txl", False, gains=True),
    ),
    Claim(
        "Transformer-XL, Table 6 (PPL init / best)",
        "without recurrence, Shaw's encoding does not gain from a longer context",
        "29.75 init = 29.75 best (attention length 120)",
        init_best_gain("shaw", False, gains=False),
    ),
    Claim(
        "ALiBi, Table / Fig. 1 (WikiText-103, trained at 512)",
        "ALiBi extrapolates: 4× the trained length no worse than 1×",
        "19.73 at 512, 18.40 at 3,512 ppl",
        extrapolation_order(("alibi", 4), ("alibi", 1)),
    ),
    Claim(
        "ALiBi, Table / Fig. 1",
        "sinusoids do not: 4× worse than 1×",
        "20.05 at 512, 178.97 at 3,512 ppl",
        extrapolation_order(("sinusoid", 1), ("sinusoid", 4)),
    ),
    Claim(
        "ALiBi, Table / Fig. 1",
        "rotary degrades beyond its length: 4× worse than 1×",
        "20.07 at 512, 35.54 at 3,512 ppl",
        extrapolation_order(("rope", 1), ("rope", 4)),
    ),
    Claim(
        "ALiBi, Table / Fig. 1",
        "at 16×, ALiBi below T5's buckets",
        "18.31 vs 64.94 ppl at 12,512 (24×)",
        extrapolation_order(("alibi", 16), ("t5", 16)),
    ),
    Claim(
        "ALiBi, Table / Fig. 1",
        "ALiBi extrapolates far: at its longest length no worse than at 1× (here 512×, 32,768, "
        "on the whole test split)",
        "19.73 at 512, 18.31 ppl at 12,512 (24×)",
        extrapolation_order(("alibi", 512), ("alibi", 1), sweep=WHOLE_SPLIT),
    ),
    Claim(
        "KERPLE, Table 3 (GitHub, trained at 512)",
        "at 32× the trained length the logarithmic kernel is below ALiBi",
        "KERPLE (log) 3.40 → 2.75, ALiBi 3.42 → 3.02 ppl from 512 to 16,384 (32×); "
        "OpenWebText2: 23.9 → 21.4 vs 23.9 → 22.5",
        extrapolation_order(("kerple", 32), ("alibi", 32), ("kerple",)),
    ),
    Claim(
        "KERPLE, Table 3 (GitHub, trained at 512)",
        "far past the trained length the logarithmic kernel stays below ALiBi (here 512×, 32,768, "
        "on the whole test split)",
        "KERPLE (log) 2.75, ALiBi 3.02 ppl at 16,384 (32×)",
        extrapolation_order(("kerple", 512), ("alibi", 512), ("kerple",), sweep=WHOLE_SPLIT),
    ),
    Claim(
        "FIRE, Fig. 1 / Table 1 (C4, trained at 2,048)",
        "FIRE below KERPLE at 4–8× the trained length (here 8×)",
        "FIRE lowest of all at 8,192–16,384 (its figures)",
        extrapolation_order(("fire", 8), ("kerple", 8), ("fire", "kerple")),
        "FIRE's paper trains at 2,048 tokens; here its MLP learns the bias over 64 positions, and "
        "past them it degrades, where KERPLE's logarithmic form carries on",
    ),
    Claim(
        "PI (Chen et al. 2023), Table 1",
        "a short fine-tune with interpolated positions makes the longer window useful: RoPE "
        "fine-tuned at 4× below RoPE at 1×",
        "LLaMA 7B 2,048 → 8,192 after 1,000 steps: ppl falls with the window",
        extrapolation_order((PI_LABEL, 4), ("rope", 1)),
        "bytes and heads of 32 dims: interpolating by 4 puts neighbouring bytes a quarter of a "
        "position apart in every frequency, which the 400-step fine-tune at a tenth of the "
        "learning rate does not recover (LLaMA's tokens and 128-dim heads lose less); NTK-aware "
        "and YaRN, which leave the fastest frequencies as trained, score far lower at 4× after "
        "the same fine-tune (their fine-tuned rows in extrapolation.md)",
    ),
    Claim(
        "YaRN, Table 1 (Llama 2 7B fine-tuned at 2×, 8,192)",
        "fine-tuned at 2× the trained length, YaRN below NTK-aware at that length",
        "YaRN 3.35, NTK-aware 3.59 (PI 3.34) ppl at 8,192",
        extrapolation_order((fine_tuned_label("yarn"), 2), (fine_tuned_label("ntk"), 2)),
        "bytes and heads of 32 dims: 16 frequencies, of which YaRN's ramp (β scaled to the "
        "trained 64) keeps 6 as trained and interpolates 4 fully and 6 in part, where LLaMA's "
        "128-dim heads have 64; its attention temperature (0.1 ln s + 1) was fitted on LLaMA. "
        "The gap is 0.02 bpc, about 1 %",
    ),
    Claim(
        "YaRN, Table 1 (Llama 2 7B fine-tuned at 2×, 8,192)",
        "past the length it was fine-tuned at, YaRN degrades least: below PI and NTK-aware "
        "(here at twice it)",
        "YaRN 6.04, NTK-aware 6.24, PI 8.07 ppl at 10,240 (1.25× the fine-tuned length)",
        below_each((past_label("yarn"), 4), [(past_label("linear"), 4), (past_label("ntk"), 4)]),
    ),
    Claim(
        "Transformer-XL, Table 8",
        "RECL: TXL > with Shaw > without recurrence > vanilla",
        "700 > 400 > 300 > 128 (r = 0.1)",
        recl_order,
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
            verdict = with_why(verdict, f"at this scale: {claim.scale}")
        judged.append((claim, verdict))
    return judged


def render(results: dict, contains=contains) -> str:
    a = results.get("ablation.json", {}).get("settings", {})
    e = results.get(EXTRAPOLATION, {}).get("settings", {})
    lines = [
        "# This project against the papers",
        "",
        "Command: `python -m experiments.papers`, from the sweeps' JSONs beside this file. Each claim is "
        "judged on this project's runs of the same comparison: agrees / disagrees where the runs "
        "order the two sides by the sweeps' rule (twice the larger seed spread, or a bootstrap "
        "interval where runs kept windows: paired on the same tokens, at two lengths on the "
        "blocks of them that both lengths' windows end at), not resolved where they do not "
        "separate them, not comparable where the runs measured something else or nothing yet. "
        "Orders are compared, never numbers.",
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
    names = ("ablation.json", EXTRAPOLATION, WHOLE_SPLIT, "recl.json", "init_best.json",
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
