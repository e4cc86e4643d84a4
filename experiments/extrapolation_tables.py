"""Renders ``extrapolation.json``, the results of ``experiments.extrapolation``, into
``extrapolation.md`` (test bpc against evaluation length, a table for each protocol: the mean over
seeds with its bootstrap interval where the runs kept their windows, else ± sd; and what holds
beyond chance) and ``extrapolation.png``.
"""

from __future__ import annotations

import pathlib
from operator import itemgetter

from experiments import compare, sweep
from relpos_jax.analysis import bootstrap

PROTOCOLS = ("non-overlapping", "sliding")


def _series(results: dict) -> tuple[dict, dict]:
    """{row label: {protocol: {L: [bpc of each seed]}}} and the same of each seed's windows (None
    where a run kept none); rows: "scheme" or "scheme (sized)"."""
    series: dict[str, dict[str, dict[str, list]]] = {}
    windows: dict[str, dict[str, dict[str, list]]] = {}
    for run in results["runs"]:
        row = run["label"] + ("" if run["variant"] == "defaults" else f" ({run['variant']})")
        kept = run.get("bpc_windows") or {}
        for protocol, by_length in run["bpc"].items():
            for length, value in by_length.items():
                series.setdefault(row, {}).setdefault(protocol, {}).setdefault(length, []).append(
                    value
                )
                windows.setdefault(row, {}).setdefault(protocol, {}).setdefault(length, []).append(
                    kept.get(protocol, {}).get(length)
                )
    return series, windows


def _scored(s: dict, windows: dict) -> str:
    """The test tokens every length was scored on, and the windows that makes at the longest (for
    the whole split, its targets as a run kept them: its windows may be summed into blocks)."""
    tokens, longest = s["tokens"], max(s["lengths"])
    if tokens:
        return f"the first {tokens:,} test tokens ({-(-tokens // longest):,} windows at L = {longest:,})"
    kept = [
        w
        for by_protocol in windows.values()
        for w in by_protocol.get("non-overlapping", {}).get(str(longest), [])
        if compare.has_windows(w)
    ]
    if not kept:
        return "every test token"
    targets = int(kept[0]["tokens"].sum())
    return (
        f"every test token ({targets:,} targets, {-(-targets // longest):,} windows at "
        f"L = {longest:,})"
    )


def _extension_settings(s: dict) -> str:
    """The extensions' settings, as recorded (none in sweeps from before they were)."""
    if "extensions_up_to" not in s:
        return ""
    yarn = s["yarn"]
    return (
        f", up to {s['extensions_up_to']}× (YaRN β_fast {yarn['beta_fast']:g}, "
        f"β_slow {yarn['beta_slow']:g})"
    )


def _fine_tune_settings(s: dict) -> str:
    """What the fine-tuned rows are, as recorded (PI alone in sweeps from before ``fine_tune``)."""
    if not s.get("pi_steps") or not s.get("pi_factors"):
        return ""
    kinds = ", ".join(s.get("fine_tune", ["linear"]))
    factors = ", ".join(f"{f}×" for f in s["pi_factors"])
    past = (  # scored past their length since the sweep took --fine-tune
        '; "at 2× its length": the same models at twice the length they were fine-tuned at'
        if "fine_tune" in s
        else ""
    )
    return (
        f" rope+X, fine-tuned: each seed's RoPE run fine-tuned {s['pi_steps']} steps at {factors} "
        f"its length with X ({kinds}; `configs/rope_pi.py`), scored at that length{past}."
    )


def render(results: dict) -> str:
    s, (series, windows) = results["settings"], _series(results)
    lines = [
        "# Train short, test long (the ALiBi paper's Table 2, small scale)",
        "",
        f"Command: `{s['command']}`  ",
        f"Commit {s['commit']}, {s['machine']}, {s['date']}. Every scheme trained without memory at "
        f"length {s['train_len']} for {s['steps']} steps, seeds {', '.join(map(str, s['seeds']))}; "
        f"scored with no memory on {_scored(s, windows)}. Sized: position tables "
        "within the trained distances (Shaw's k, T5's max distance, DeBERTa's buckets). rope+X: "
        "RoPE's extension X applied at evaluation, factor L / train length"
        f"{_extension_settings(s)}.{_fine_tune_settings(s)} {_summary_rule()}",
    ]
    stride = "windows moved by L / 2" if s.get("stride") is None else f"stride {s['stride']}"
    for protocol in PROTOCOLS:
        sliding = protocol == "sliding"
        lengths = _shown_lengths(s, protocol)
        if not lengths:
            continue
        lines += [
            "",
            f"**{protocol}**" + (f" ({stride}; L up to {_sliding_up_to(s):,})" if sliding else ""),
            "",
            "| scheme | " + " | ".join(f"L={n}" for n in lengths) + " |",
            "|---|" + "---:|" * len(lengths),
        ]
        for row, by_protocol in series.items():
            by_length, kept = by_protocol.get(protocol, {}), windows[row].get(protocol, {})
            cells = [_cell(by_length.get(n, []), kept.get(n, []), len(s["seeds"])) for n in lengths]
            lines.append(f"| {row} | " + " | ".join(cells) + " |")
    lines += _beyond_chance(s, series, windows)
    same = s.get("sized_as_defaults") or []
    if same:
        lines += ["", f"No sized row for {', '.join(same)}: sized to length {s['train_len']}, its "
                  "tables are its defaults (the same config, so the same numbers)."]  # fmt: skip
    if s.get("scored_only") and _incomplete(s, series):
        lines += ["", "Tabulated from the lengths scored so far (`--scored-only`): a cell with fewer "
                  "seeds, or –, is still to be scored."]  # fmt: skip
    reused = sweep.commits_lines(s, results["runs"], itemgetter("scheme"), itemgetter("seed"))
    return "\n".join([*lines, *sweep.missing_lines(s), *(["", *reused] if reused else []), ""])


def _sliding_up_to(s: dict) -> int:
    """The longest L scored with sliding windows (0: none; a sweep from before the setting: all)."""
    up_to = s.get("sliding_up_to")
    return max(s["lengths"]) if up_to is None else up_to


def _shown_lengths(s: dict, protocol: str) -> list[str]:
    """The lengths ``protocol``'s table shows: every one, sliding only up to ``sliding_up_to``."""
    return [str(n) for n in s["lengths"] if protocol != "sliding" or n <= _sliding_up_to(s)]


def _incomplete(s: dict, series: dict) -> bool:
    """Whether a cell the tables show lacks a seed."""
    return any(
        len(by.get(protocol, {}).get(n, [])) < len(s["seeds"])
        for by in series.values()
        for protocol in PROTOCOLS
        for n in _shown_lengths(s, protocol)
    )


def _summary_rule() -> str:
    return (
        f"Test bpc: the mean over the seeds [its {bootstrap.LEVEL:.0%} bootstrap interval: the "
        f"seeds, then the windows scored at that length, resampled {bootstrap.REPLICATES:,} times] "
        "where every seed kept its windows, else mean ± sd over the seeds."
    )


def _beyond_chance(s: dict, series: dict, windows: dict) -> list[str]:
    """What the non-overlapping scores show beyond chance, from the cells that hold every seed: each
    row from its training length to the longest length it has, and the ranking at the longest
    length where every row has them all and at the longest where two rows or more do
    (``compare.Compare``: the paired bootstrap where every seed kept its windows, the two lengths
    paired on the blocks of the same tokens that both lengths' windows end at; else twice the
    larger spread over seeds)."""
    seeds, train, protocol = len(s["seeds"]), str(s["train_len"]), "non-overlapping"
    complete = {
        row: [n for n in map(str, s["lengths"]) if len(by.get(protocol, {}).get(n, [])) == seeds]
        for row, by in series.items()
    }
    scores = lambda row, n: series[row][protocol][n]  # noqa: E731
    along, rules = [], set()
    for row, lengths in complete.items():
        if train not in lengths or lengths[-1] == train:
            continue
        far = lengths[-1]
        ends = compare.Compare(
            {n: scores(row, n) for n in (train, far)},
            {n: windows[row][protocol][n] for n in (train, far)}, shared_blocks=True,
        )  # fmt: skip
        rules.add(ends.difference_rule.removeprefix("whose "))
        if ends.apart(far, train):
            verb = "rises" if ends.mean(far) > ends.mean(train) else "falls"
            change = ends.difference_text(far, train, 3)
            along.append(f"- {row}: {verb} from {ends.mean(train):.3f} at L={train} to "
                         f"{ends.mean(far):.3f} at L={far}{change}")  # fmt: skip
        elif ends.bootstrap or seeds > 1:
            along.append(f"- {row}: L={train} to L={far} not apart")
        else:
            along.append(f"- {row}: L={train} to L={far} not compared (one seed, and the two "
                         "lengths' windows are not paired: not kept, or not nested)")  # fmt: skip
    lines = [
        "",
        "Each row from its trained length to its longest, where the two differ beyond chance "
        f"({'; '.join(sorted(rules)) or 'no row'}; non-overlapping, cells with every seed):",
        "",
        *(along or ["- none"]),
    ]
    for far, rows in _ranked_lengths(s, complete).items():
        at_far = compare.Compare(
            {row: scores(row, far) for row in rows},
            {row: windows[row][protocol][far] for row in rows},
        )
        order = sorted(at_far.values, key=at_far.mean)
        ranked = [
            f"- {row} lower than {after}, next in the ranking{at_far.difference_text(row, after, 3)}"
            for row, after in at_far.in_ranking(order)
        ]
        some = f" ({len(rows)} of {len(complete)} rows: those with every seed there)"
        lines += [
            "",
            f"The ranking at L={far}{some if len(rows) < len(complete) else ''}, neighbours "
            f"{at_far.difference_rule} (non-overlapping):",
            "",
            *(ranked or ["- none"]),
        ]
    return lines


def _ranked_lengths(s: dict, complete: dict) -> dict[str, list]:
    """Where the rows are ranked, and which (the rows with every seed there): the longest length
    that every row has, and the longest that two rows or more have where it is another."""
    have = {
        n: [row for row, lengths in complete.items() if n in lengths]
        for n in map(str, s["lengths"])
    }
    ranked = [n for n, rows in have.items() if len(rows) > 1]
    every = [n for n in ranked if len(have[n]) == len(complete)]
    return {n: have[n] for n in dict.fromkeys(every[-1:] + ranked[-1:])}


def _cell(values: list[float], windows: list, seeds: int) -> str:
    """The mean over the seeds measured, with its bootstrap interval where each kept its windows
    (else ± sd); how many, where fewer than the sweep's; "–" for none."""
    if not values:
        return "–"
    text = compare.Compare({0: values}, {0: windows}).cell(0, 3)
    return text if len(values) == seeds else f"{text} ({len(values)} of {seeds} seeds)"


def plot(results: dict, path: pathlib.Path) -> None:
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    s, (series, _) = results["settings"], _series(results)
    colors = colormaps["tab20"].colors
    # A protocol is drawn where it has a line (two lengths); non-overlapping where none has.
    drawn = [p for p in PROTOCOLS if len(_shown_lengths(s, p)) > 1] or [PROTOCOLS[0]]
    fig = Figure(figsize=(5.5 * len(drawn), 4), layout="constrained")
    for i, protocol in enumerate(drawn):
        ax = fig.add_subplot(1, len(drawn), i + 1)
        for k, (row, by_protocol) in enumerate(series.items()):
            lengths = sorted(int(n) for n in by_protocol.get(protocol, {}))
            means = [compare.mean_sd(by_protocol[protocol][str(n)])[0] for n in lengths]
            style = "--" if row.startswith("rope+") or "(" in row else "-"
            ax.plot(lengths, means, style, marker="o", ms=3, color=colors[k % 20], label=row)
        ax.axvline(s["train_len"], color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set(xlabel="evaluation length L (tokens)", ylabel="test bpc, mean over seeds")
        ax.set_ylim(top=min(8.0, ax.get_ylim()[1]))
        ax.set_title(f"{protocol} (trained at {s['train_len']})")
    ax.legend(fontsize=7, ncol=2)
    fig.savefig(path, dpi=120)
