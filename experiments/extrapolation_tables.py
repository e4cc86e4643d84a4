"""Renders ``extrapolation.json``, the results of ``experiments.extrapolation``, into
``extrapolation.md`` (test bpc against evaluation length, mean ± sd over seeds, a table for each
protocol, and what holds beyond twice the spread) and ``extrapolation.png``.
"""

from __future__ import annotations

import pathlib

from experiments import compare, sweep

PROTOCOLS = ("non-overlapping", "sliding")


def _series(results: dict) -> dict[str, dict[str, dict[str, list[float]]]]:
    """{row label: {protocol: {L: [bpc of each seed]}}}; rows: "scheme" or "scheme (sized)"."""
    series: dict[str, dict[str, dict[str, list[float]]]] = {}
    for run in results["runs"]:
        row = run["label"] + ("" if run["variant"] == "defaults" else f" ({run['variant']})")
        for protocol, by_length in run["bpc"].items():
            for length, value in by_length.items():
                series.setdefault(row, {}).setdefault(protocol, {}).setdefault(length, []).append(
                    value
                )
    return series


def _scored(tokens: int) -> str:
    return f"the first {tokens:,} test tokens" if tokens else "every test token"


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
    s, series = results["settings"], _series(results)
    up_to = s.get("sliding_up_to") or max(s["lengths"])
    lines = [
        "# Train short, test long (the ALiBi paper's Table 2, small scale)",
        "",
        f"Command: `{s['command']}`  ",
        f"Commit {s['commit']}, {s['machine']}, {s['date']}. Every scheme trained without memory at "
        f"length {s['train_len']} for {s['steps']} steps, seeds {', '.join(map(str, s['seeds']))}; "
        f"scored with no memory on {_scored(s['tokens'])}. Sized: position tables "
        "within the trained distances (Shaw's k, T5's max distance, DeBERTa's buckets). rope+X: "
        "RoPE's extension X applied at evaluation, factor L / train length"
        f"{_extension_settings(s)}.{_fine_tune_settings(s)} Test bpc, mean ± sd over the seeds.",
    ]
    stride = "windows moved by L / 2" if s.get("stride") is None else f"stride {s['stride']}"
    for protocol in PROTOCOLS:
        sliding = protocol == "sliding"
        lengths = _shown_lengths(s, protocol)
        if not lengths:
            continue
        lines += [
            "",
            f"**{protocol}**" + (f" ({stride}; L up to {up_to:,})" if sliding else ""),
            "",
            "| scheme | " + " | ".join(f"L={n}" for n in lengths) + " |",
            "|---|" + "---:|" * len(lengths),
        ]
        for row, by_protocol in series.items():
            by_length = by_protocol.get(protocol, {})
            cells = [_cell(by_length.get(n, []), len(s["seeds"])) for n in lengths]
            lines.append(f"| {row} | " + " | ".join(cells) + " |")
    lines += _beyond_spread(s, series)
    same = s.get("sized_as_defaults") or []
    if same:
        lines += ["", f"No sized row for {', '.join(same)}: sized to length {s['train_len']}, its "
                  "tables are its defaults (the same config, so the same numbers)."]  # fmt: skip
    if s.get("scored_only") and _incomplete(s, series):
        lines += ["", "Tabulated from the lengths scored so far (`--scored-only`): a cell with fewer "
                  "seeds, or –, is still to be scored."]  # fmt: skip
    return "\n".join([*lines, *sweep.missing_lines(s), ""])


def _shown_lengths(s: dict, protocol: str) -> list[str]:
    """The lengths ``protocol``'s table shows: every one, sliding only up to ``sliding_up_to``."""
    up_to = s.get("sliding_up_to") or max(s["lengths"])
    return [str(n) for n in s["lengths"] if protocol != "sliding" or n <= up_to]


def _incomplete(s: dict, series: dict) -> bool:
    """Whether a cell the tables show lacks a seed."""
    return any(
        len(by.get(protocol, {}).get(n, [])) < len(s["seeds"])
        for by in series.values()
        for protocol in PROTOCOLS
        for n in _shown_lengths(s, protocol)
    )


def _beyond_spread(s: dict, series: dict) -> list[str]:
    """What the non-overlapping scores show beyond twice the larger spread over seeds, from the
    cells that hold every seed: each row from its training length to the longest length it has,
    and the ranking at the longest length where every row has them all."""
    seeds, train, protocol = len(s["seeds"]), str(s["train_len"]), "non-overlapping"
    complete = {
        row: [n for n in map(str, s["lengths"]) if len(by.get(protocol, {}).get(n, [])) == seeds]
        for row, by in series.items()
    }
    scores = lambda row, n: series[row][protocol][n]  # noqa: E731
    mean = lambda row, n: compare.mean_sd(scores(row, n))[0]  # noqa: E731
    found = []
    for row, lengths in complete.items():
        if train not in lengths or lengths[-1] == train:
            continue
        far = lengths[-1]
        if compare.apart(scores(row, train), scores(row, far)):
            verb = "rises" if mean(row, far) > mean(row, train) else "falls"
            found.append(f"- {row}: {verb} from {mean(row, train):.3f} at L={train} to "
                         f"{mean(row, far):.3f} at L={far}")  # fmt: skip
        else:
            found.append(f"- {row}: L={train} to L={far} within the spread")
    shared = [n for n in map(str, s["lengths"]) if all(n in c for c in complete.values())]
    if shared and len(complete) > 1:
        far = shared[-1]
        at_far = {row: scores(row, far) for row in complete}
        order = sorted(at_far, key=lambda row: mean(row, far))
        for row, after in compare.apart_in_ranking(order, at_far):
            found.append(f"- at L={far}: {row} lower than {after}, next in the ranking")
    head = [
        "",
        "Beyond twice the larger spread over seeds (non-overlapping, cells with every seed):",
    ]
    return [*head, "", *(found or ["- none"])]


def _cell(values: list[float], seeds: int) -> str:
    """mean ± sd over the seeds measured; how many, where fewer than the sweep's; "–" for none."""
    if not values:
        return "–"
    text = compare.mean_sd_text(values, 3)
    return text if len(values) == seeds else f"{text} ({len(values)} of {seeds} seeds)"


def plot(results: dict, path: pathlib.Path) -> None:
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    s, series = results["settings"], _series(results)
    colors = colormaps["tab20"].colors
    fig = Figure(figsize=(11, 4), layout="constrained")
    for i, protocol in enumerate(PROTOCOLS):
        ax = fig.add_subplot(1, 2, i + 1)
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
