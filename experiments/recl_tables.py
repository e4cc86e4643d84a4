"""Renders ``recl.json``, the results of ``experiments.recl``, into ``recl.md``: each model's RECL
within its group (mean ± sd over seeds, each seed's bootstrap interval), beside the paper's Table 8,
and its test bpc at each context; a ``recl.json`` of the earlier protocol as it was rendered.
"""

from __future__ import annotations

import math

from experiments import compare

PAPER = {  # Dai et al. 2019, Table 8 (WikiText-103, 128M models): RECL at r = 0.1 / 0.5 / 1.0
    ("txl", True): ("Transformer-XL 128M", "700 / 600 / 500"),
    ("shaw", True): ("with Shaw et al.'s encoding", "400 / 400 / 300"),
    ("txl", False): ("without recurrence", "300"),
    ("sinusoid", False): ("vanilla Transformer", "128"),
    ("learned", False): ("vanilla Transformer", "128"),
}


def _bounded(value: int, longest: int) -> str:
    return f"{'≥' if value >= longest else ''}{value}"


def _cell(values: list[float], longest: int, digits: int = 0) -> str:
    """Mean ± sd; "≥" where a seed's RECL reached the longest context (a lower bound)."""
    bound = "≥" if any(v >= longest for v in values) else ""
    return bound + compare.mean_sd_text(values, digits)


def _interval(row: dict, r, longest: int) -> str:
    point, (lo, hi) = row["recl"][str(r)], row["recl_interval"][str(r)]
    return f"{_bounded(point, longest)} [{lo}, {_bounded(hi, longest)}]"


def _scored(row: dict) -> str:
    """How a row's model was scored: memory, windows, or windows of at most its trained length."""
    longest = row.get("longest_window")
    return f"{row['scoring']}s ≤ {longest}" if longest else row["scoring"]


def render(results: dict) -> str:
    if results.get("protocol") is None:
        return render_earlier(results)
    s, contexts, b = results["settings"], results["contexts"], results["bootstrap"]
    longest, seg = contexts[-1], s["segment"]
    by_label: dict[str, list[dict]] = {}
    for row in results["runs"]:
        by_label.setdefault(row["label"], []).append(row)
    members = "; ".join(by_label)
    shown = contexts if len(contexts) <= 4 else [*contexts[:3], "…", longest]
    steps = ", ".join(map(str, shown))
    r_head = " | ".join(f"RECL r={r}" for r in results["r"])
    capped = (
        " A model with absolute positions (*windows ≤ W*) is given windows of at most its "
        "training window W, as a vanilla Transformer is evaluated: it never trained on a position "
        "past W, so a longer window would score untrained positions, not unused context. Its "
        f"loss stops changing at c = W − {seg}."
    )
    lines = [
        "# Relative effective context length (Transformer-XL §4.3, appendix C)",
        "",
        f"Command: `{s['command']}`  ",
        f"Commit {s['commit']}, {s['machine']}, {s['date']}.",
        "",
        f"**The group**: {members}. RECL is a property of a model within its group, not of the "
        "model alone: at each context the baseline is the group's best loss on each token, so "
        "another group gives other numbers. The paper's Table 8 group is Transformer-XL, with Shaw "
        "et al.'s encoding, without recurrence and a vanilla Transformer (Al-Rfou et al.'s learned "
        "its positions; here sinusoids); its RECL is on WikiText-103 words with 128M models.",
        "",
        f"**Contexts** c = {steps} (Δ = {results['delta']}), the same {s['tokens']:,} test tokens "
        f"for every model and context, scored in segments of s = {seg}, each model as it was "
        "trained:",
        "",
        "- *memory* (trained with memory): a memory of c positions carried from segment to "
        "segment; a token at offset j of its segment attends to the c + j positions before it at "
        "every layer, and older text reaches it through the memory states (the recurrence it was "
        "trained with);",
        f"- *windows* (trained without memory): each segment of {seg} targets from a fresh window "
        f"of the c + {seg} tokens that end with it, no memory; a token at offset j sees exactly "
        "the c + j tokens before it." + (capped if results["protocol"] >= 3 else ""),
        "",
        f"Every token attends to between c and c + {seg - 1} earlier tokens in both; at c = 0 "
        "the two are the same evaluation. **RECL**: the first c whose step to c + Δ lowers the "
        "perplexity of the group's top-r hardest tokens (by the baseline) by less than 1%; ≥: "
        f"a model still gained at the longest context, {longest}, a lower bound. "
        f"[interval]: {b['level']:.0%} percentile bootstrap over the scored tokens in blocks of "
        f"{b['block']}, {b['replicates']:,} replicates, one draw for the whole group, seed "
        f"{b['seed']}.",
        "",
    ]
    several = any(len(rows) > 1 for rows in by_label.values())
    lines += [
        f"| model | scored | seeds | {r_head} | paper, Table 8 (r = 0.1 / 0.5 / 1.0) |",
        "|---|---|---:|" + "---:|" * len(results["r"]) + "---|",
    ]
    for label, rows in by_label.items():
        if several:
            cells = [_cell([row["recl"][str(r)] for row in rows], longest) for r in results["r"]]
        else:
            cells = [_interval(rows[0], r, longest) for r in results["r"]]
        name, values = PAPER.get((rows[0]["scheme"], rows[0]["mem_len"] > 0), ("", ""))
        paper = f"{name}: {values}" if name else ""
        lines.append(
            f"| {label} | {_scored(rows[0])} | {len(rows)} | {' | '.join(cells)} | {paper} |"
        )
    if several:
        lines += [
            "",
            "RECL above: mean ± sd over the seeds, each seed's runs one group. Each seed's RECL "
            "[interval]:",
            "",
            f"| model | seed | {r_head} |",
            "|---|---:|" + "---:|" * len(results["r"]),
        ]
        for label, rows in by_label.items():
            for row in rows:
                cells = [_interval(row, r, longest) for r in results["r"]]
                lines.append(f"| {label} | {row['seed']} | {' | '.join(cells)} |")
    lines += [
        "",
        "Test bpc at each context, mean over seeds:",
        "",
        "| c | " + " | ".join(by_label) + " |",
        "|---:|" + "---:|" * len(by_label),
    ]
    for c in contexts:
        cells = [f"{sum(row['bpc'][str(c)] for row in rows) / len(rows):.4f}"
                 for rows in by_label.values()]  # fmt: skip
        lines.append(f"| {c} | " + " | ".join(cells) + " |")
    return "\n".join([*lines, *_init_and_best(by_label, contexts), ""])


def _init_and_best(by_label: dict[str, list[dict]], contexts: list[int]) -> list[str]:
    """Table 6's "PPL init" and "PPL best" from the bpc at each context: each model at the
    context it was trained with (its memory; the segment alone without memory) and at its best
    context, mean over seeds."""
    lines = [
        "",
        "Transformer-XL's Table 6 reports each model at the attention length it was trained with "
        "(init) and at the best one (best); here, from the bpc at each context above, mean over "
        "seeds: init at c = the memory it was trained with (0 without memory), best at the c of "
        "the lowest mean.",
        "",
        "| model | init: c | bpc | best: c | bpc |",
        "|---|---:|---:|---:|---:|",
    ]
    for label, rows in by_label.items():
        mean = {c: sum(row["bpc"][str(c)] for row in rows) / len(rows) for c in contexts}
        trained = rows[0]["mem_len"] if rows[0]["mem_len"] in mean else None
        best = min(mean, key=mean.get)
        init = f"{trained} | {mean[trained]:.4f}" if trained is not None else "— | —"
        lines.append(f"| {label} | {init} | {best} | {mean[best]:.4f} |")
    return lines


def render_earlier(results: dict) -> str:
    """A ``recl.json`` of the earlier protocol, as it was rendered, with what that protocol was."""
    s, contexts = results["settings"], results["contexts"]
    longest = contexts[-1]
    by_label: dict[str, list[dict]] = {}
    for row in results["runs"]:
        by_label.setdefault(row["label"], []).append(row)
    lines = [
        "# Relative effective context length (Transformer-XL, appendix C)",
        "",
        f"Command: `{s['command']}`  ",
        f"Commit {s['commit']}, {s['machine']}, {s['date']}. **The earlier protocol**, not the "
        "paper's: the group is every run listed (an oracle baseline, not Table 8's group), the "
        "contexts double instead of stepping by a fixed Δ, every model is scored with memory = c "
        "(same_length) whether or not it was trained with memory, and there are no intervals; "
        "`python -m experiments.recl --ablation` measures the paper's protocol.",
        "",
        f"The same {s['tokens']:,} test tokens "
        f"for every model and context, segments of {s['segment']}, the memory length as the context "
        "(same_length); the group's per-token best loss at c is the baseline; RECL is the first c "
        "whose step to the next context gains less than 1% over the top-r hardest tokens. Mean ± "
        "sd over the seeds (each seed's runs are one group); ≥: some seed still gained at the "
        f"longest context, {longest}, so that mean is a lower bound.",
        "",
        "| model | seeds | "
        + " | ".join(f"bpc @ {c}" for c in contexts)
        + " | "
        + " | ".join(f"RECL r={r}" for r in results["r"])
        + " |",
        "|---|---:|" + "---:|" * (len(contexts) + len(results["r"])),
    ]
    for label, rows in by_label.items():
        bpc = [_cell([row["bpc"][str(c)] for row in rows], math.inf, 4) for c in contexts]
        recl = [_cell([row["recl"][str(r)] for row in rows], longest) for r in results["r"]]
        lines.append(f"| {label} | {len(rows)} | " + " | ".join(bpc + recl) + " |")
    pairs = [label for label, rows in by_label.items() if "pair_recl" in rows[0]]
    if pairs:
        lines += [
            "",
            "Each scheme's pair (with and without memory) as its own group:",
            "",
            "| model | " + " | ".join(f"RECL r={r}" for r in results["r"]) + " |",
            "|---|" + "---:|" * len(results["r"]),
        ]
        for label in pairs:
            rows = by_label[label]
            cells = [
                _cell([row["pair_recl"][str(r)] for row in rows], longest) for r in results["r"]
            ]
            lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join([*lines, ""])
