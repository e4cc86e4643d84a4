"""Which seeds solve a probe: a seed solves it when its accuracy averaged over the distances the
probe trains on reaches ``SOLVED``. The lookup is learnt or not, so a mean over seeds that mixes
solved and unsolved seeds says little; the tables give the share of seeds that solve it, with its
exact 95 % interval, and whether the shares with memory and with the key in the segment differ
(Fisher's exact test, a scheme each, adjusted for the schemes tested by Holm's method; over the
schemes together, the exact test stratified by scheme): ``compare.share_text``,
``compare.shares_p``, ``compare.holm``, ``compare.stratified_shares_p``.
"""

from __future__ import annotations

from experiments import compare

SOLVED = 0.9  # a seed's accuracy over the trained distances that counts as solving the probe
APART = 0.05  # shares whose two-sided p (Holm-adjusted over the schemes) is below this differ
PARTLY = 0.1  # above chance by this much, below SOLVED: a seed that learnt the lookup in part


def label(scheme: str, condition: str) -> str:
    """``scheme, condition`` as the probe tables name a column or a group of seeds."""
    return f"{scheme}, {condition.replace('_', ' ')}"


def trained_accuracy(settings: dict, curve) -> list[float]:
    """The accuracies of ``curve`` at the distances the probe trains on (``settings["trained"]``;
    every distance for a JSON that predates that record)."""
    low, high = settings.get("trained", (0, float("inf")))
    return [
        point["byte_accuracy"]
        for point in curve
        if low <= point["distance"] <= high and point["byte_accuracy"] is not None
    ]


def solves(trained: list[float]) -> bool:
    """Whether a seed's accuracies at the trained distances (``trained_accuracy``) average at least
    ``SOLVED``: it has learnt the lookup."""
    return bool(trained) and sum(trained) / len(trained) >= SOLVED


def solved_by(results: dict, field: str = "curve") -> dict[tuple[str, str], tuple[int, int]]:
    """(seeds whose accuracy averaged over the trained distances reaches ``SOLVED``, seeds) of
    each (scheme, condition)."""
    counts: dict[tuple[str, str], tuple[int, int]] = {}
    for run in results["runs"]:
        if field not in run:
            continue
        solved = solves(trained_accuracy(results["settings"], run[field]))
        done, seeds = counts.get((run["scheme"], run["condition"]), (0, 0))
        counts[run["scheme"], run["condition"]] = (done + solved, seeds + 1)
    return counts


def solved_lines(results: dict) -> list[str]:
    """The table of seeds that solve the probe: a row a scheme, a column a condition, and, where a
    scheme ran with memory and in the segment, the p that the two shares differ."""
    s = results["settings"]
    if "trained" not in s:  # recorded before the trained range was
        return []
    low, high = s["trained"]
    counts = solved_by(results)
    conditions = list(dict.fromkeys(condition for _, condition in counts))
    paired = {"memory", "in_segment"} <= set(conditions)
    lines = [
        "",
        f"Seeds that solve it (accuracy averaged over the trained distances {low}–{high} at least "
        f"{SOLVED}), of the seeds run, with the share's exact 95% interval (Clopper–Pearson)"
        + (
            "; p: Fisher's exact test, two-sided, that the shares with memory and in the segment "
            "differ; Holm: that p adjusted for the schemes tested (Holm's step-down: with a test "
            f"a scheme, one p below {APART} by chance alone is likely; * below {APART}); over the "
            "schemes together, one exact test stratified by scheme (each scheme's seeds compared "
            "with its own)"
            if paired
            else ""
        )
        + ":",
        "",
        "| scheme | " + " | ".join(c.replace("_", " ") for c in conditions) + " |"
        + (" p | Holm |" if paired else ""),
        "|---|" + "---:|" * (len(conditions) + 2 * paired),
    ]  # fmt: skip
    schemes = list(dict.fromkeys(scheme for scheme, _ in counts))
    tested = [s for s in schemes if (s, "memory") in counts and (s, "in_segment") in counts]
    ps = [compare.shares_p(counts[s, "memory"], counts[s, "in_segment"]) for s in tested]
    both = {s: (p, adjusted) for s, p, adjusted in zip(tested, ps, compare.holm(ps), strict=True)}
    for scheme in schemes:
        cells = [
            compare.share_text(*counts[scheme, c]) if (scheme, c) in counts else ""
            for c in conditions
        ]
        if paired:
            p, adjusted = both.get(scheme, (None, None))
            cells += ["", ""] if p is None else [_p_format(p, star=False), _p_format(adjusted)]
        lines.append(f"| {scheme} | " + " | ".join(cells) + " |")
    return lines + (_pooled_line(counts) if paired else []) + _partly_lines(results)


def _partly_lines(results: dict) -> list[str]:
    """The seeds between chance and solved (accuracy over the trained distances at least
    ``PARTLY`` above chance, below ``SOLVED``), each with its accuracy: how much the counts lean on
    where the bar is."""
    low = results["chance"] + PARTLY
    partly: dict[str, list[str]] = {}
    for run in results["runs"]:
        trained = trained_accuracy(results["settings"], run.get("curve", ()))
        mean = sum(trained) / len(trained) if trained else 0.0
        if low <= mean < SOLVED:
            named = label(run["scheme"], run["condition"])
            partly.setdefault(named, []).append(f"{run['seed']} ({mean:.2f})")
    found = "; ".join(
        f"{named}: seed{'s' * (len(seeds) > 1)} {', '.join(seeds)}"
        for named, seeds in partly.items()
    )
    return ["", f"Learnt in part (accuracy over the trained distances {low:.2f} to below {SOLVED}): "
            f"{found or 'none'}."]  # fmt: skip


def _pooled_line(counts: dict[tuple[str, str], tuple[int, int]]) -> list[str]:
    """The schemes together, with memory and in the segment, and the p of the exact test stratified
    by scheme (a scheme's seeds compared only with its own): is memory's lookup harder to learn
    over all the schemes? Needs two schemes run under both conditions."""
    pairs = [
        (counts[scheme, "memory"], counts[scheme, "in_segment"])
        for scheme, condition in counts
        if condition == "memory" and (scheme, "in_segment") in counts
    ]
    if len(pairs) < 2:
        return []
    memory, seeds = _total(a for a, _ in pairs)
    in_segment, seeds_in_segment = _total(b for _, b in pairs)
    p = compare.stratified_shares_p(pairs)
    return [
        f"| {len(pairs)} schemes together (p stratified by scheme) | {memory} of {seeds} "
        f"| {in_segment} of {seeds_in_segment} | {_p_format(p)} | |"
    ]


def _total(shares) -> tuple[int, int]:
    """The shares' ``(k, n)`` summed."""
    shares = list(shares)
    return sum(k for k, _ in shares), sum(n for _, n in shares)


def _p_format(p: float, star: bool = True) -> str:
    return (f"{p:.3f}" if p >= 0.001 else "< 0.001") + (" *" if star and p < APART else "")
