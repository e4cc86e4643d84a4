"""RECL (Transformer-XL Appendix C): answers known by construction, the paper's formula, validation,
the fixed-Δ grid, the bootstrap over tokens, and the per-context losses of a tiny model in both
scorings (with memory; in sliding windows, held to a one-token-at-a-time reference)."""

from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import optax
import pytest

from relpos_jax import data as data_lib
from relpos_jax.analysis.recl import (
    context_token_losses,
    fixed_grid,
    recl,
    recl_intervals,
    relative_gain,
    relative_gains,
    scoring_losses,
    window_token_losses,
)
from relpos_jax.evaluate import evaluate
from tests.helpers import tiny_model

CONTEXTS = [100, 200, 300, 400, 500, 600]


def _improving_until(base, stop, step=0.1):
    """{c: base − step per 100 of context up to ``stop``}: no gain past ``stop``."""
    return {c: base - step * min(c, stop) / 100 for c in CONTEXTS}


def test_recl_is_where_losses_stop_improving(rng):
    base = rng.uniform(2.0, 4.0, 500)
    assert recl({"xl": _improving_until(base, 300)}, r=1.0) == {"xl": 300}
    assert recl({"xl": _improving_until(base, 300)}, r=0.1) == {"xl": 300}


def test_recl_never_below_threshold_is_the_longest_context(rng):
    base = rng.uniform(2.0, 4.0, 50)
    assert recl({"xl": _improving_until(base, 10_000)}, r=0.5) == {"xl": 600}


def test_gains_count_only_below_the_group_baseline(rng):
    """A model that improves by itself but never beats the group's best short-context loss gains 0."""
    base = rng.uniform(2.0, 4.0, 200)
    group = {"xl": _improving_until(base, 500), "rnn": _improving_until(base + 1.0, 500)}
    assert recl({"rnn": group["rnn"]}, r=1.0) == {"rnn": 500}  # alone: its own baseline
    assert recl(group, r=1.0) == {"xl": 500, "rnn": 100}  # the rnn never reaches xl's losses


def test_r_selects_the_hardest_tokens():
    """10 hard tokens keep improving until 500, 90 easy ones stop at 200: r picks which counts."""
    hard = np.arange(100) % 10 == 0
    table = {
        c: np.where(hard, 8.0 - 0.05 * min(c, 500) / 100, 1.0 - 0.1 * min(c, 200) / 100)
        for c in CONTEXTS
    }
    # r = 0.1: T = the hard tokens, gain 1 − e^−0.05 ≈ 0.049 per step until 500.
    assert recl({"xl": table}, r=0.1) == {"xl": 500}
    # r = 1.0: after 200 the hard tokens move the mean by 0.005 only: gain ≈ 0.005 < 0.01.
    assert recl({"xl": table}, r=1.0) == {"xl": 200}


def _paper_gain(losses_c, losses_long_i, r):
    """g_i(c, c′) straight from Appendix C, with Python loops; losses_c: every model's l(c, ·)."""
    n = len(losses_c[0])
    b = [min(model[t] for model in losses_c) for t in range(n)]
    hard = sorted(range(n), key=lambda t: -b[t])[: math.ceil(r * n)]

    def f(long_losses):
        return sum(min(b[t], long_losses[t]) for t in hard) / len(hard)

    own_short = losses_c[0]  # f_i(c, c) with model i = model 0
    return (math.exp(f(own_short)) - math.exp(f(losses_long_i))) / math.exp(f(own_short))


@pytest.mark.parametrize("r", [0.1, 0.5, 1.0])
def test_relative_gain_matches_the_paper_formula(rng, r):
    losses_c = [rng.uniform(0.5, 6.0, 40) for _ in range(3)]
    long_i = losses_c[0] - rng.uniform(-0.5, 1.0, 40)
    baseline = np.min(losses_c, axis=0)
    np.testing.assert_allclose(
        relative_gain(baseline, long_i, r=r), _paper_gain(losses_c, long_i, r), rtol=1e-12
    )
    group = {name: {1: short, 2: long_i} for name, short in zip("abc", losses_c, strict=True)}
    gains = relative_gains(group, r=r)
    np.testing.assert_allclose(gains["a"][1], _paper_gain(losses_c, long_i, r), rtol=1e-12)


@pytest.mark.parametrize(
    ("token_losses", "r", "match"),
    [
        ({}, 0.1, "token_losses is empty"),
        ({"xl": {100: np.ones(4)}}, 0.1, "at least two"),
        ({"xl": {200: np.ones(4), 100: np.ones(4)}}, 0.1, "not increasing"),
        ({"xl": {100: np.ones(4), 200: np.ones(5)}}, 0.1, "same tokens"),
        (
            {"xl": {100: np.ones(4), 200: np.ones(4)}, "rnn": {100: np.ones(4), 300: np.ones(4)}},
            0.1,
            "same context lengths",
        ),
        ({"xl": {100: np.ones((2, 2)), 200: np.ones(4)}}, 0.1, "1-D"),
        ({"xl": {100: np.ones(4), 200: np.ones(4)}}, 0.0, "r=0.0 is invalid"),
        ({"xl": {100: np.ones(4), 200: np.ones(4)}}, 1.5, "r=1.5 is invalid"),
    ],
)
def test_invalid_inputs_fail_with_one_line(token_losses, r, match):
    with pytest.raises(ValueError, match=match) as error:
        recl(token_losses, r=r)
    assert "\n" not in str(error.value)


# A tiny model end to end: T = 4, 2 rows, 24 scored tokens.
T, ROWS, N = 4, 2, 24
TOKENS = np.random.default_rng(3).integers(0, 256, 200).astype(np.int32)


def _losses(model, contexts, same_length):
    return context_token_losses(
        model, TOKENS, contexts, segment_len=T, n_tokens=N, batch_size=ROWS, same_length=same_length
    )


def test_context_zero_is_evaluation_without_memory():
    model = tiny_model("txl")
    losses = _losses(model, [0], same_length=False)[0]
    assert losses.shape == (N,)
    reference = evaluate(
        model, data_lib.ArrayStream(TOKENS), batch_size=ROWS, segment_len=T, mem_len=0, max_tokens=N
    )
    np.testing.assert_allclose(losses.mean(), reference["loss"], rtol=1e-5)


def _window_losses(model, first_target, context, width):
    """The loss of each target from a fresh pass over the ``context`` + 1 inputs before it.

    Every pass has ``width`` inputs (one shape, one compilation) and a mask that hides all but the
    last ``context`` + 1 from the last query; the others see at least themselves (no empty rows).
    """
    targets = np.arange(first_target, first_target + N)
    windows = np.stack([TOKENS[p - width : p] for p in targets])  # [N, width]
    q, k = np.arange(width)[:, None], np.arange(width)[None, :]
    mask = ((k <= q) & (k >= width - 1 - context)) | (k == q)
    logits, _ = model(jnp.asarray(windows), model.init_mems(N, 0), attention_mask=jnp.asarray(mask))
    return optax.softmax_cross_entropy_with_integer_labels(logits[:, -1], TOKENS[targets])


def test_same_length_gives_each_token_exactly_its_context():
    """One layer: memory holds embeddings only, so mem_len = c with same_length is a c + 1 window."""
    model = tiny_model("txl", n_layers=1)
    contexts = [0, 5]
    losses = _losses(model, contexts, same_length=True)
    first_target = 2 * T + 1  # after the warm-up of ceil(5 / T) segments
    for c in contexts:
        assert losses[c].shape == (N,)
        expected = _window_losses(model, first_target, c, width=6)
        np.testing.assert_allclose(losses[c], expected, rtol=1e-4, atol=1e-5)


def test_more_memory_changes_the_losses_of_the_same_tokens():
    model = tiny_model("txl")  # 2 layers, recurrence
    losses = _losses(model, [0, 5], same_length=False)
    assert set(losses) == {0, 5} and all(v.shape == (N,) for v in losses.values())
    assert np.isfinite(losses[5]).all()
    assert np.abs(losses[0] - losses[5]).max() > 1e-3
    with pytest.raises(ValueError, match=r"contexts=.* are not increasing"):
        _losses(model, [5, 0], same_length=False)
    with pytest.raises(ValueError, match="needs"):
        context_token_losses(model, TOKENS[:20], [8], segment_len=T, n_tokens=N, batch_size=ROWS)


@pytest.mark.parametrize("r", [0.1, 0.5, 1.0])
def test_recl_is_the_first_context_whose_relative_gain_is_below_the_threshold(rng, r):
    group = {
        name: {c: rng.uniform(1.0, 3.0, 300) - 0.02 * k * (c / 100) for c in CONTEXTS}
        for k, name in enumerate(["a", "b", "c"])
    }
    gains = relative_gains(group, r=r)
    for name, value in recl(group, r=r).items():
        below = [c for c in CONTEXTS[:-1] if gains[name][c] < 0.01]
        assert value == (below[0] if below else CONTEXTS[-1])


def test_the_fixed_grid_steps_by_delta():
    assert fixed_grid(32, 512) == list(range(0, 513, 32))
    assert fixed_grid(100, 700, first=100) == [100, 200, 300, 400, 500, 600, 700]
    assert fixed_grid(64, 64) == [0, 64]
    for delta, longest, first in [(0, 64, 0), (32, 500, 0), (32, 32, 32), (32, 512, -32)]:
        with pytest.raises(ValueError, match="fixed_grid") as error:
            fixed_grid(delta, longest, first)
        assert "\n" not in str(error.value)


def _noisy_group(rng, n=400):
    """xl improves until 400, rnn until 200 (noisy per token); xl_twin is xl's very losses."""
    noise = {name: rng.normal(0, 0.3, (len(CONTEXTS), n)) for name in ("xl", "rnn")}
    base = rng.uniform(2.0, 4.0, n)
    group = {
        name: {c: base - 0.05 * min(c, stop) / 100 + noise[name][i] * 0.1 for i, c in
               enumerate(CONTEXTS)}
        for name, stop in (("xl", 400), ("rnn", 200))
    }  # fmt: skip
    return {**group, "xl_twin": dict(group["xl"])}


def test_bootstrap_intervals_hold_the_point_are_seeded_and_equal_for_identical_models(rng):
    group = _noisy_group(rng)
    intervals = recl_intervals(group, replicates=200, seed=3)
    for r in (0.1, 0.5, 1.0):
        point = recl(group, r=r)
        for name, by_r in intervals.items():
            interval = by_r[r]
            assert interval.point == point[name]
            assert interval.contains(interval.point), (name, r, interval)
            assert interval.lo in CONTEXTS and interval.hi in CONTEXTS  # replicate values
        assert intervals["xl"][r] == intervals["xl_twin"][r]
    assert recl_intervals(group, replicates=200, seed=3) == intervals  # deterministic
    again = recl_intervals(group, replicates=200, seed=4, block=20)
    assert {n: {r: i.point for r, i in v.items()} for n, v in again.items()} == {
        n: {r: i.point for r, i in v.items()} for n, v in intervals.items()
    }  # the seed and blocks move the interval, never the point
    with pytest.raises(ValueError, match="replicates=0 is invalid"):
        recl_intervals(group, replicates=0)
    with pytest.raises(ValueError, match="block=0 is invalid"):
        recl_intervals(group, block=0)


def test_a_group_whose_tokens_agree_has_a_tight_interval(rng):
    """Every token improves the same way: any resample gives the same RECL."""
    base = rng.uniform(2.0, 4.0, 100)
    group = {"xl": _improving_until(base, 300), "rnn": _improving_until(base + 0.5, 300)}
    intervals = recl_intervals(group, r_values=(1.0,), replicates=50)
    assert intervals["xl"][1.0].lo == intervals["xl"][1.0].hi == 300


def _layout_of(k, context, n=N, rows=ROWS, seg=T, warmup=8):
    """Where scored target k's window starts and ends in TOKENS: (first input, last input)."""
    row_len = -(-n // rows)
    row, i = divmod(k, row_len)
    last = row * row_len + warmup + i
    return last - context - i % seg, last


@pytest.mark.parametrize(("position", "n_tokens"), [("txl", N), ("txl", N - 2), ("sinusoid", N)])
def test_sliding_windows_equal_each_token_scored_alone_in_float64(position, n_tokens):
    """Each target from its own window (the c + j inputs before it and itself; j: its offset in
    its segment), one at a time, the log-softmax in float64: the batched windows give the same."""
    model = tiny_model(position)
    contexts = [0, 3, 6]
    losses = window_token_losses(
        model, TOKENS, contexts, segment_len=T, n_tokens=n_tokens, batch_size=ROWS,
        windows_per_call=4,
    )  # fmt: skip
    for c in contexts:
        assert losses[c].shape == (n_tokens,)
        expected = []
        for k in range(n_tokens):
            first, last = _layout_of(k, c, n=n_tokens)
            logits, _ = model(jnp.asarray(TOKENS[None, first : last + 1]), model.init_mems(1, 0))
            logits = np.asarray(logits[0, -1], np.float64)
            log_z = np.log(np.exp(logits - logits.max()).sum()) + logits.max()
            expected.append(log_z - logits[TOKENS[last + 1]])
        np.testing.assert_allclose(losses[c], expected, rtol=2e-5, atol=2e-5)


def test_absolute_positions_are_scored_in_windows_no_longer_than_trained():
    """A window cap W: contexts up to W − T are scored as without it, longer ones as W − T (an
    absolute-position model never trained on a later position); the cap only where positions are
    absolute and the model was trained without memory."""
    from relpos_jax.analysis.context_losses import trained_window
    from relpos_jax.config import Config

    model = tiny_model("sinusoid")
    kwargs = {"segment_len": T, "n_tokens": N, "batch_size": ROWS}
    free = window_token_losses(model, TOKENS, [0, 3, 6, 9], **kwargs)
    capped = window_token_losses(model, TOKENS, [0, 3, 6, 9], longest_window=T + 3, **kwargs)
    for c in (0, 3):
        np.testing.assert_array_equal(capped[c], free[c])
    for c in (6, 9):
        np.testing.assert_array_equal(capped[c], free[3])
        assert np.abs(free[c] - free[3]).max() > 1e-3  # the cap changed what was scored
    with pytest.raises(ValueError, match=r"longest_window=3 is invalid; use None or an int >= "):
        window_token_losses(model, TOKENS, [0], longest_window=T - 1, **kwargs)

    def config(position, mem_len):
        return Config.from_any({"model": {"position": position, "mem_len": mem_len},
                                 "data": {"segment_len": 64}})  # fmt: skip

    assert trained_window(config("sinusoid", 0)) == trained_window(config("learned", 0)) == 64
    assert trained_window(config("sinusoid", 64)) is None  # scored with memory, not in windows
    assert trained_window(config("txl", 0)) is trained_window(config("alibi", 0)) is None


def test_one_layer_sees_the_same_span_with_memory_and_in_windows():
    """One layer: memory holds the embeddings, so memory c (same_length=False) is the c + j window;
    with more layers they part only through the recurrence, never at c = 0."""
    one = tiny_model("txl", n_layers=1)
    kwargs = {"segment_len": T, "n_tokens": N, "batch_size": ROWS}
    memory = scoring_losses(one, TOKENS, [0, 3, 6], scoring="memory", **kwargs)
    window = scoring_losses(one, TOKENS, [0, 3, 6], scoring="window", **kwargs)
    for c in (0, 3, 6):
        np.testing.assert_allclose(memory[c], window[c], rtol=1e-5, atol=1e-5)
    two = tiny_model("txl")
    memory = scoring_losses(two, TOKENS, [0, 6], scoring="memory", **kwargs)
    window = scoring_losses(two, TOKENS, [0, 6], scoring="window", **kwargs)
    np.testing.assert_allclose(memory[0], window[0], rtol=1e-5, atol=1e-5)
    assert np.abs(memory[6] - window[6]).max() > 1e-4  # the memory states carry older text
    with pytest.raises(ValueError, match="scoring='rnn' is invalid"):
        scoring_losses(two, TOKENS, [0], scoring="rnn", **kwargs)


def test_a_replicate_is_recl_of_the_resampled_tokens(rng):
    """The bootstrap weighs each token by how often it is drawn: the same RECL as copying them."""
    from relpos_jax.analysis.recl import _recls, _stacked

    group = _noisy_group(rng)
    names, contexts, losses = _stacked(group)
    for _ in range(5):
        drawn = rng.integers(0, losses.shape[2], losses.shape[2])
        weights = np.bincount(drawn, minlength=losses.shape[2])[None]
        (by_weights,) = _recls(losses, contexts, [0.1, 0.5, 1.0], 0.01, weights)
        copied = {name: {c: group[name][c][drawn] for c in contexts} for name in names}
        for i, r in enumerate([0.1, 0.5, 1.0]):
            assert dict(zip(names, by_weights[i].tolist(), strict=True)) == recl(copied, r=r)
