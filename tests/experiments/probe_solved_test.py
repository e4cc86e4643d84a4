"""``experiments.probe_solved``: which seeds solve a probe, the share's exact interval, and Fisher's
exact test between the share with memory and the share in the segment, against closed forms."""

from __future__ import annotations

import math

import pytest

from experiments import compare, probe_solved


@pytest.mark.parametrize("n", [1, 3, 8])
def test_the_share_interval_is_clopper_pearsons_at_its_closed_form_ends(n):
    assert compare.share_interval(0, n) == pytest.approx((0.0, 1 - 0.025 ** (1 / n)))
    assert compare.share_interval(n, n) == pytest.approx((0.025 ** (1 / n), 1.0))


def test_the_share_interval_holds_the_share_and_narrows_with_more_seeds():
    low, high = compare.share_interval(2, 4)
    assert low < 0.5 < high
    narrower = compare.share_interval(20, 40)
    assert low < narrower[0] < 0.5 < narrower[1] < high
    assert compare.share_text(1, 6) == "1 of 6 [0.00, 0.64]"


def test_fishers_test_matches_the_hypergeometric_tails():
    assert compare.shares_p((3, 4), (1, 4)) == pytest.approx(34 / 70)  # the lady tasting tea
    assert compare.shares_p((0, 8), (8, 8)) == pytest.approx(2 / math.comb(16, 8))
    assert compare.shares_p((2, 6), (2, 6)) == pytest.approx(1.0)


def _stratified_by_enumeration(pairs) -> float:
    """The exact stratified test's p, naively: every table of every stratum with its margins kept,
    weighted by its hypergeometric count, the sum's distribution tallied, then Fisher's rule."""
    weights = {0: 1.0}  # the sum of the counts under a -> its (unnormalised) probability
    for (k_a, n_a), (k_b, n_b) in pairs:
        solved, tallied = k_a + k_b, {}
        for total, weight in weights.items():
            for x in range(solved + 1):
                if x <= n_a and solved - x <= n_b:
                    count = math.comb(n_a, x) * math.comb(n_b, solved - x)
                    tallied[total + x] = tallied.get(total + x, 0.0) + weight * count
        weights = tallied
    norm = sum(weights.values())
    observed = weights[sum(k_a for (k_a, _), _ in pairs)] / norm
    return sum(w / norm for w in weights.values() if w / norm <= observed * (1 + 1e-7))


@pytest.mark.parametrize("pairs", [
    [((1, 6), (3, 6)), ((2, 6), (6, 6))],
    [((0, 4), (4, 4)), ((3, 5), (1, 3)), ((2, 2), (2, 2))],  # the last stratum says nothing
    [((1, 6), (3, 6)), ((2, 6), (6, 6)), ((2, 6), (5, 6)), ((0, 6), (1, 6)), ((1, 6), (1, 6))],
])  # fmt: skip
def test_the_stratified_test_matches_its_naive_enumeration(pairs):
    assert compare.stratified_shares_p(pairs) == pytest.approx(_stratified_by_enumeration(pairs))
    one = pairs[:1]
    assert compare.stratified_shares_p(one) == pytest.approx(compare.shares_p(*one[0]))


def test_strata_pointing_the_same_way_add_up_where_each_alone_does_not():
    stratum = ((1, 6), (5, 6))
    assert compare.shares_p(*stratum) > 0.05
    assert compare.stratified_shares_p([stratum] * 4) < 0.001
    assert compare.stratified_shares_p([stratum, ((5, 6), (1, 6))]) == pytest.approx(1.0)


def _results(per_seed: dict) -> dict:
    settings = {"trained": [8, 48]}
    runs = [
        {"scheme": scheme, "condition": condition, "seed": seed,
         "curve": [{"distance": 8, "byte_accuracy": a}, {"distance": 64, "byte_accuracy": 0.1}]}
        for (scheme, condition), accuracies in per_seed.items()
        for seed, a in enumerate(accuracies)
    ]  # fmt: skip
    return {"settings": settings, "chance": 0.1, "runs": runs}


def test_holms_adjustment_multiplies_by_the_tests_left_and_never_falls():
    assert compare.holm([0.01, 0.04, 0.03, 0.005]) == pytest.approx([0.03, 0.06, 0.06, 0.02])
    assert compare.holm([0.5, 0.9]) == [1.0, 1.0] and compare.holm([0.02]) == [0.02]
    assert compare.holm([]) == []


def test_a_p_below_the_bar_for_one_scheme_of_several_is_not_marked_after_holm():
    runs = {(scheme, "memory"): [0.1] * 8 for scheme in ("txl", "shaw", "t5")}
    runs |= {("txl", "in_segment"): [1.0] * 5 + [0.1] * 3}  # 0 vs 5 of 8: p = 0.026
    runs |= {(scheme, "in_segment"): [0.1] * 8 for scheme in ("shaw", "t5")}
    lines = probe_solved.solved_lines(_results(runs))
    assert "| txl | 0 of 8 [0.00, 0.37] | 5 of 8 [0.24, 0.91] | 0.026 | 0.077 |" in lines


def test_the_solved_table_gives_a_row_a_scheme_and_marks_shares_that_differ():
    results = _results({
        ("txl", "memory"): [0.1] * 8,
        ("txl", "in_segment"): [1.0] * 8,  # 0 of 8 against 8 of 8: p = 2 / C(16, 8)
        ("shaw", "memory"): [1.0, 0.1],
        ("shaw", "in_segment"): [0.95, 0.25],  # seed 1 learnt it in part
        ("rope", "memory"): [0.89],  # below SOLVED, in part
    })  # fmt: skip
    assert probe_solved.solved_by(results)["shaw", "memory"] == (1, 2)
    lines = probe_solved.solved_lines(results)
    assert "| scheme | memory | in segment | p | Holm |" in lines
    assert "| txl | 0 of 8 [0.00, 0.37] | 8 of 8 [0.63, 1.00] | < 0.001 | < 0.001 * |" in lines
    assert "| shaw | 1 of 2 [0.01, 0.99] | 1 of 2 [0.01, 0.99] | 1.000 | 1.000 |" in lines
    assert "| rope | 0 of 1 [0.00, 0.97] |  |  |  |" in lines
    pooled = compare.stratified_shares_p([((0, 8), (8, 8)), ((1, 2), (1, 2))])
    together = "| 2 schemes together (p stratified by scheme) | 1 of 10 | 9 of 10 |"
    assert lines[-3] == f"{together} {pooled:.3f} * | |"
    assert lines[-1] == (
        "Learnt in part (accuracy over the trained distances 0.20 to below 0.9): shaw, in segment: "
        "seed 1 (0.25); rope, memory: seed 0 (0.89)."
    )
    only_memory = _results({("txl", "memory"): [1.0, 0.1]})
    lines = probe_solved.solved_lines(only_memory)
    assert "| scheme | memory |" in lines and lines[-1].endswith("below 0.9): none.")  # no p
    two = probe_solved.solved_lines(_results({("alibi", "memory"): [0.5, 1.0, 0.3]}))
    assert two[-1].endswith("below 0.9): alibi, memory: seeds 0 (0.50), 2 (0.30).")
    assert probe_solved.solved_lines({"settings": {}, "runs": []}) == []  # no trained range kept
