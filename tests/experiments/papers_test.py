"""``experiments.papers``: each paper's claim judged on synthetic sweep results by the sweeps' rule, and
the committed table rendered from the committed JSONs."""

from __future__ import annotations

from experiments import papers
from tests.helpers import ROOT


def _ablation(bpc: dict[tuple[str, bool], list[float]], commit: str = "new") -> dict:
    runs = [
        {
            "scheme": scheme,
            "memory": 64 if memory else 0,
            "seed": seed,
            "test_bpc": value,
            "bpc_by_position": [value] * 4,
        }
        for (scheme, memory), values in bpc.items()
        for seed, value in enumerate(values)
    ]
    return {"settings": {"commit": commit, "steps": 10, "sets": []}, "runs": runs}


def _extrapolation(bpc: dict[str, dict[int, list[float]]], commit: str = "new") -> dict:
    runs = [
        {"scheme": label, "variant": "defaults", "seed": seed, "label": label,
         "bpc": {"non-overlapping": {str(8 * f): v[seed] for f, v in by.items()}}}
        for label, by in bpc.items() for seed in range(3)
    ]  # fmt: skip
    return {"settings": {"commit": commit, "train_len": 8, "steps": 10}, "runs": runs}


def _verdicts(results: dict, current: bool = True) -> dict[str, papers.Verdict]:
    contains = lambda commit, ancestor: current  # noqa: E731  (every change in, or none)
    return {claim.claim: v for claim, v in papers.judge_all(results, contains)}


def test_claims_are_judged_by_the_order_of_the_two_sides_beyond_the_spread():
    results = {
        "ablation.json": _ablation({
            ("txl", True): [2.00, 2.01, 2.02], ("txl", False): [2.30, 2.31, 2.29],  # apart: agrees
            ("shaw", True): [2.40, 2.41, 2.39],  # txl below shaw: agrees
            ("shaw", False): [2.35, 2.36, 2.34],  # shaw with memory above: disagrees
            ("sinusoid+half", False): [2.2, 2.5, 2.8],  # spread 0.3: not resolved
        }),
    }  # fmt: skip
    verdicts = _verdicts(results)
    recurrence = verdicts[
        "recurrence helps its relative encoding: TXL with memory below TXL without"
    ]
    assert recurrence.verdict == "agrees" and "txl, memory 2.0100 ± 0.0100" in recurrence.ours
    assert verdicts["with recurrence, its encoding beats Shaw's"].verdict == "agrees"
    assert verdicts["recurrence helps Shaw's encoding too"].verdict == "disagrees"
    absolute = verdicts[
        "without recurrence, relative (TXL) beats absolute sinusoids (trained on half loss; "
        "compared on the latter half of each segment, where that model trained)"
    ]
    assert absolute.verdict == "not resolved" and "spread" in absolute.why
    assert verdicts["RECL: TXL > with Shaw > without recurrence > vanilla"].ours == "not measured"


def test_a_claim_measured_with_a_former_implementation_is_not_comparable():
    scores = {"alibi": {32: [2.70, 2.71, 2.72]}, "kerple": {32: [2.60, 2.61, 2.62]}}
    results = {"extrapolation.json": _extrapolation(scores, commit="abc1234")}
    claim = "at 32× the trained length the logarithmic kernel is below ALiBi"
    assert _verdicts(results, current=True)[claim].verdict == "agrees"
    former = _verdicts(results, current=False)[claim]
    assert former.verdict == "not comparable" and "former KERPLE" in former.why
    assert "measured at abc1234" in former.why
    alibi = _verdicts(results, current=False)["at 16×, ALiBi below T5's buckets"]
    assert alibi.verdict == "not comparable" and alibi.ours == "not measured"


def test_the_claims_at_512x_read_the_whole_test_split_and_only_it():
    scores = {"alibi": {1: [2.30, 2.31, 2.32], 512: [2.20, 2.21, 2.22]},
              "kerple": {512: [2.40, 2.41, 2.42]}}  # fmt: skip
    far = "far past the trained length the logarithmic kernel stays below ALiBi (here 512×, "
    far += "32,768, on the whole test split)"
    first_tokens = _verdicts({"extrapolation.json": _extrapolation(scores)})
    assert first_tokens[far].ours == "not measured"
    whole = _verdicts({papers.WHOLE_SPLIT: _extrapolation(scores, commit="abc1234")})
    assert whole[far].verdict == "disagrees" and "kerple at 512× 2.4100" in whole[far].ours
    alibi = [v for claim, v in whole.items() if claim.startswith("ALiBi extrapolates far")]
    assert [v.verdict for v in alibi] == ["agrees"]
    former = _verdicts({papers.WHOLE_SPLIT: _extrapolation(scores, commit="abc1234")}, False)
    assert former[far].verdict == "not comparable" and "measured at abc1234" in former[far].why


def test_one_seed_on_a_side_decides_nothing_and_says_so():
    verdict = papers.order([1.0], [3.0, 3.1], ("a", "b"))
    assert verdict.verdict == "not resolved" and verdict.why == "one seed on a side: no claim"


def test_position_interpolation_is_judged_by_its_fine_tune_against_rope_at_its_length():
    scores = {"rope": {1: [2.00, 2.01, 2.02]}, papers.PI_LABEL: {4: [1.90, 1.91, 1.92]}}
    verdict = _verdicts({"extrapolation.json": _extrapolation(scores)})[
        "a short fine-tune with interpolated positions makes the longer window useful: RoPE "
        "fine-tuned at 4× below RoPE at 1×"
    ]
    assert verdict.verdict == "agrees" and "rope+linear, fine-tuned at 4×" in verdict.ours


def test_yarn_past_its_fine_tuned_length_must_be_below_pi_and_ntk_both():
    from experiments.extrapolation import past_label

    claim = (
        "past the length it was fine-tuned at, YaRN degrades least: below PI and NTK-aware "
        "(here at twice it)"
    )
    yarn, pi, ntk = (past_label(kind) for kind in ("yarn", "linear", "ntk"))
    spread = lambda m: [m, m + 0.01, m + 0.02]  # noqa: E731
    below_both = {yarn: {4: spread(2.0)}, pi: {4: spread(2.5)}, ntk: {4: spread(2.3)}}
    above_ntk = {yarn: {4: spread(2.0)}, pi: {4: spread(2.5)}, ntk: {4: spread(1.8)}}
    level_with_ntk = {yarn: {4: spread(2.0)}, pi: {4: spread(2.5)}, ntk: {4: spread(2.01)}}
    judged = [
        _verdicts({"extrapolation.json": _extrapolation(scores)})[claim]
        for scores in (below_both, above_ntk, level_with_ntk)
    ]
    assert [v.verdict for v in judged] == ["agrees", "disagrees", "not resolved"]
    assert f"{yarn} at 4×" in judged[0].ours and f"{ntk} at 4×" in judged[0].ours
    assert judged[2].why == "within twice the larger seed spread"
    missing = _verdicts({"extrapolation.json": _extrapolation({yarn: {4: spread(2.0)}})})[claim]
    assert missing.verdict == "not comparable"


def test_a_claim_across_lengths_pairs_the_two_on_the_blocks_their_windows_share():
    import numpy as np

    rng = np.random.default_rng(0)
    hard = rng.gamma(4.0, 0.5, 128)  # each token's difficulty: the same text at both lengths
    results = {"extrapolation.json": _extrapolation({"alibi": {1: [2.0] * 3, 4: [1.9] * 3}})}
    for run in results["extrapolation.json"]["runs"]:
        bits = hard + rng.normal(0, 0.05, 128)
        by_length = {}
        for factor, gain in ((1, 0.0), (4, -0.1)):  # 4×: every token 0.1 bit lower
            length = 8 * factor
            sums = (bits + gain).reshape(-1, length).sum(1)
            by_length[str(length)] = {"bits": sums, "tokens": np.full(len(sums), length),
                                      "layout": f"segments of {length}"}  # fmt: skip
        run["bpc_windows"] = {"non-overlapping": by_length}
    verdict = _verdicts(results)["ALiBi extrapolates: 4× the trained length no worse than 1×"]
    assert verdict.verdict == "agrees", verdict
    assert "alibi at 4× " in verdict.ours and " [" in verdict.ours  # intervals, not ± sd
    assert "(difference -0.1000 [" in verdict.ours  # paired on the same tokens: exactly the gain


def _recl(intervals: dict[tuple[str, bool], list[tuple[int, int]]], protocol: int = 3) -> dict:
    """A recl.json: each (scheme, memory)'s interval at r = 0.1 in each seed's group."""
    runs = [
        {"label": f"{scheme}, memory {64 if memory else 0}", "scheme": scheme,
         "mem_len": 64 if memory else 0, "seed": seed, "recl": {"0.1": (lo + hi) // 2},
         "recl_interval": {"0.1": [lo, hi]}}
        for (scheme, memory), by_seed in intervals.items()
        for seed, (lo, hi) in enumerate(by_seed)
    ]  # fmt: skip
    return {"recl.json": {"settings": {"group": "paper"}, "protocol": protocol, "runs": runs}}


RECL_CLAIM = "RECL: TXL > with Shaw > without recurrence > vanilla"


def test_recl_is_judged_pair_by_pair_down_the_papers_order_by_each_seeds_intervals():
    ordered = {("txl", True): [(96, 128), (96, 96)], ("shaw", True): [(64, 64), (64, 64)],
               ("txl", False): [(32, 32), (32, 32)], ("sinusoid", False): [(0, 0), (0, 0)]}  # fmt: skip
    agrees = _verdicts(_recl(ordered))[RECL_CLAIM]
    assert agrees.verdict == "agrees" and "txl, memory 64 above shaw, memory 64" in agrees.why
    overlapping = {**ordered, ("shaw", True): [(64, 96), (96, 96)]}  # seed 1: txl not above
    assert _verdicts(_recl(overlapping))[RECL_CLAIM].verdict == "not resolved"
    reversed_ = {**ordered, ("sinusoid", False): [(64, 64), (64, 64)]}  # vanilla above txl none
    assert _verdicts(_recl(reversed_))[RECL_CLAIM].verdict == "disagrees"
    former = _verdicts(_recl(ordered, protocol=2))[RECL_CLAIM]
    assert former.verdict == "not comparable" and "past its trained length" in former.why


def test_the_committed_comparison_is_rendered_from_the_committed_jsons():
    results = papers.gather(ROOT / "docs" / "results")
    assert papers.render(results) == (ROOT / "docs" / "results" / "papers.md").read_text()


def _init_best(gains: dict[tuple[str, bool], list[tuple[float, float]]]) -> dict:
    """An init_best.json: each (scheme, memory)'s best − init interval, a seed each (best at 128
    where it lies below zero, else at init)."""
    runs = []
    for (scheme, memory), by_seed in gains.items():
        for seed, (lo, hi) in enumerate(by_seed):
            init, best = (64 if memory else 0), (128 if hi < 0 else 64 if memory else 0)
            bpc = {str(init): 2.0, str(best): 2.0 + (lo + hi) / 2}
            runs.append({"scheme": scheme, "memory": 64 if memory else 0, "seed": seed,
                         "init": init, "best": best, "bpc": bpc, "gain": [(lo + hi) / 2, lo, hi]})  # fmt: skip
    return {"init_best.json": {"settings": {"commit": "new"}, "runs": runs}}


def test_init_and_best_are_judged_by_each_seeds_interval_of_the_gain():
    gains_txl, shaw_claim = "with recurrence, its encoding gains from evaluating with a longer " \
        "context than it trained with", "with recurrence, Shaw's encoding does not gain from a " \
        "longer context"  # fmt: skip
    below, across = [(-0.02, -0.01)] * 3, [(-0.01, 0.005)] * 3
    verdicts = _verdicts(_init_best({("txl", True): below, ("shaw", True): across}))
    assert verdicts[gains_txl].verdict == "agrees" and "3 of 3 seeds" in verdicts[gains_txl].why
    assert "init 2.0000 → best 1.9850 at c = 128 (3 seeds)" in verdicts[gains_txl].ours
    assert verdicts[shaw_claim].verdict == "agrees"  # no seed gains beyond chance
    verdicts = _verdicts(
        _init_best({("txl", True): [*below[:2], across[0]], ("shaw", True): below})
    )
    assert (
        verdicts[gains_txl].verdict == "not resolved" and "2 of 3 seeds" in verdicts[gains_txl].why
    )
    assert verdicts[shaw_claim].verdict == "disagrees"
    assert _verdicts({})[shaw_claim].verdict == "not comparable"


def test_a_disagreement_says_what_differs_in_scale():
    fire = "FIRE below KERPLE at 4–8× the trained length (here 8×)"
    results = {"extrapolation.json": _extrapolation({"fire": {8: [2.2, 2.21, 2.22]},
                                                     "kerple": {8: [1.8, 1.81, 1.82]}})}  # fmt: skip
    verdict = _verdicts(results)[fire]
    assert (
        verdict.verdict == "disagrees"
        and "at this scale: FIRE's paper trains at 2,048" in verdict.why
    )
    agrees = {"fire": {8: [1.8, 1.81, 1.82]}, "kerple": {8: [2.2, 2.21, 2.22]}}
    assert _verdicts({"extrapolation.json": _extrapolation(agrees)})[fire].why == ""
