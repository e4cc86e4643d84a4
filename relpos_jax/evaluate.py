"""Evaluation the way the paper does it: every token of a split scored exactly once, with memory.

``evaluate(model, stream, ...)`` scans the split's rows segment by segment, the memory carried from
one segment to the next (``eval.mem_len`` may be far longer than in training), and returns the mean
loss in nats, bits per token (``bpc`` too: per character at the byte level) and perplexity over
exactly the scored tokens; only the targets' log-probabilities are computed, never ``[B, T, V]``
logits (``model.target_log_probs``: an adaptive softmax scores a big vocabulary). Evaluation-time
``clamp_len`` and ``same_length`` give a model that shares the trained parameters. One compiled call
(``score_segments``) scores ``SEGMENTS_PER_CALL`` segments, the memory carried between them by
``jax.lax.scan``: no host round trip and no cross-device sum until the end (~10% faster on a CPU).

Beside the totals, the result keeps each window's summed bits and scored tokens (``windows``): a
window is one row of one segment (``evaluate``: T consecutive tokens of the text, in the text's
order) or one sliding window (``evaluate_sliding``), so that ``relpos_jax.analysis.bootstrap`` can
resample them, paired across models scored on the same split with the same segment, rows and
tokens; ``relpos_jax.eval_results`` keeps them beside ``eval.json``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import itertools
import math
import time
from typing import Any

import jax
import numpy as np
from flax import nnx

from relpos_jax import data as data_lib
from relpos_jax import eval_progress, sharding
from relpos_jax.config import Config, ConfigError, ModelConfig
from relpos_jax.eval_progress import PassProgress
from relpos_jax.memory import scan_segments
from relpos_jax.metrics import BITS_PER_NAT
from relpos_jax.model import TransformerLM


@dataclasses.dataclass(frozen=True)
class EvalSettings:
    """How a split is scored, resolved once from a config (``EvalSettings.of``)."""

    segment_len: int
    mem_len: int
    clamp_len: int | None
    same_length: bool
    batch_size: int

    @classmethod
    def of(cls, config: Config) -> EvalSettings:
        """``eval.*`` where it is set, else the training value (``eval.py``, sweeps)."""
        ev, model = config.eval, config.model
        return cls(
            segment_len=ev.segment_len or config.data.segment_len,
            mem_len=model.mem_len if ev.mem_len is None else ev.mem_len,
            clamp_len=model.clamp_len if ev.clamp_len is None else ev.clamp_len,
            same_length=model.same_length if ev.same_length is None else ev.same_length,
            batch_size=ev.batch_size,
        )

    @classmethod
    def of_training(cls, config: Config) -> EvalSettings:
        """Validation during training: the model as it trains (its segment, memory, clamp_len and
        same_length), so that valid and train bpc are comparable step after step."""
        model = config.model
        return cls(
            segment_len=config.data.segment_len,
            mem_len=model.mem_len,
            clamp_len=model.clamp_len,
            same_length=model.same_length,
            batch_size=config.eval.batch_size,
        )

    def model_config(self, model_config: ModelConfig) -> ModelConfig:
        """``model_config`` with these settings' clamp_len and same_length (no shape changes)."""
        return dataclasses.replace(
            model_config, clamp_len=self.clamp_len, same_length=self.same_length
        )


def with_config(model: TransformerLM, model_config: ModelConfig) -> TransformerLM:
    """The same parameters under another config that changes no shapes (clamp_len, same_length)."""
    abstract = nnx.eval_shape(lambda: TransformerLM(model_config, rngs=nnx.Rngs(0)))
    graphdef, _ = nnx.split(abstract)
    return nnx.merge(graphdef, nnx.state(model))


SEGMENTS_PER_CALL = 16
"""Segments that one compiled call scores, the memory carried between them by ``jax.lax.scan``."""
TOKENS_PER_CALL = 1 << 16
"""Fewer segments a call where they are long (``segments_per_call``): a call of as many tokens takes
seconds on a CPU, its overhead is nothing beside it, and a pass kept as it goes (``PassProgress``)
is kept between calls."""
FILL_AT_MOST = 1 << 18
"""Zero-weight tokens the last call may be filled up with to keep one shape; beyond, it is shorter."""


def segments_per_call(batch_tokens: int) -> int:
    """Segments of ``batch_tokens`` tokens (rows × length) that one call scores: ``SEGMENTS_PER_CALL``,
    or as many as make ``TOKENS_PER_CALL`` (at least one)."""
    return max(1, min(SEGMENTS_PER_CALL, TOKENS_PER_CALL // batch_tokens))


def loss_sums(target_log_probs: jax.Array, segment: dict) -> dict[str, jax.Array]:
    """A segment's sums of weighted losses and of weights, per row ``[B]`` (rows split over devices
    need nothing from each other) and per position in the segment ``[T]`` (the loss against
    position that shows memory being used), from its targets' log-probabilities (the readout of
    ``score_segments``)."""
    weights = segment["weights"]
    losses = -target_log_probs * weights
    return {
        "row_loss": losses.sum(-1), "row_count": weights.sum(-1),
        "position_loss": losses.sum(0), "position_count": weights.sum(0),
    }  # fmt: skip


@functools.partial(jax.jit, static_argnums=0, donate_argnums=3)
def score_segments(graphdef, state, block: dict, mems):
    """Scores S consecutive segments ``block["inputs" | "targets" | "weights"] [S, B, T]`` in one
    call -> (``loss_sums``: each segment's row sums ``[S, B]``, the position sums summed over the S
    segments; the memory after the last segment)."""
    model = nnx.merge(graphdef, state)
    sums, mems = scan_segments(model, block, mems, loss_sums, targets=True)
    sums = {k: v if k.startswith("row_") else v.sum(0) for k, v in sums.items()}
    return sums, mems


def evaluate(
    model: TransformerLM,
    stream: data_lib.TokenStream,
    *,
    batch_size: int,
    segment_len: int,
    mem_len: int,
    max_tokens: int | None = None,
    scored_from: int = 0,
    whole_segments: bool = False,
    mesh: jax.sharding.Mesh | None = None,
    progress: PassProgress | None = None,
) -> dict[str, Any]:
    """Mean loss over every target of ``stream`` (or its first ``max_tokens``), exactly once; with
    ``scored_from``, over those at offset ``scored_from`` or later in their segment only (the rest
    are read, not scored: the latter half of each segment, where a half-loss model trained). With
    ``whole_segments``, rows are whole segments long (``data.eval_batches``): each segment starts at
    a multiple of ``segment_len``. With a ``mesh``, the rows of each batch are split over its batch
    axes (``_score``). Its ``windows``: each row of each segment, row by row (the text's order).
    With ``progress``, the pass is kept as it goes and goes on where a stopped one with the same
    progress stopped (``relpos_jax.eval_progress``; ``progress.done()`` once the result is stored)."""
    if not 0 <= scored_from < segment_len:
        raise ValueError(
            f"evaluate: scored_from={scored_from} is invalid; use an offset in [0, {segment_len})"
        )
    first, batches = _peek(
        data_lib.eval_batches(
            stream, batch_size, segment_len, max_tokens, whole_segments=whole_segments
        )
    )
    if scored_from:
        batches = ({**b, "weights": _from_offset(b["weights"], scored_from)} for b in batches)
    result = _score(model, batches, mem_len, mesh=mesh, by_row=True, progress=progress)
    rows = first["inputs"].shape[0]  # batch_size, or fewer where the split is short
    # what decides where the windows fall (not mem_len: with memory or without, the same windows)
    result["windows"]["layout"] = (
        f"segments of {segment_len}, {rows} rows, {result['tokens']} targets"
        + (f" from offset {scored_from}" if scored_from else "")
    )
    return result


def _from_offset(weights: np.ndarray, offset: int) -> np.ndarray:
    """``weights [B, T]`` with the first ``offset`` positions of the segment set to 0."""
    weights = weights.copy()
    weights[:, :offset] = 0
    return weights


def evaluate_sliding(
    model: TransformerLM,
    stream: data_lib.TokenStream,
    *,
    batch_size: int,
    window: int,
    stride: int,
    max_tokens: int | None = None,
    mesh: jax.sharding.Mesh | None = None,
    progress: PassProgress | None = None,
) -> dict[str, Any]:
    """The sliding-window protocol (no memory): every target once, after ≥ ``window − stride`` tokens
    of context recomputed from scratch; ``stride`` 1 is the vanilla model of the Transformer-XL paper's
    evaluation-speed table, which recomputes its whole context for every token. ``progress``: as
    ``evaluate``'s."""
    batches = data_lib.sliding_batches(stream, batch_size, window, stride, max_tokens)
    result = _score(model, batches, 0, mesh=mesh, progress=progress)  # no memory: windows alone
    tokens = result["tokens"]
    result["windows"]["layout"] = f"sliding windows of {window}, stride {stride}, {tokens} targets"
    return result


def _peek(batches):
    """(the first of ``batches``, all of them)."""
    batches = iter(batches)
    first = next(batches)
    return first, itertools.chain([first], batches)


def _score(
    model: TransformerLM, batches, mem_len: int, *, mesh=None, by_row=False, progress=None
) -> dict[str, Any]:
    """Sums the weighted losses of ``batches``, ``segments_per_call`` of them a call
    (``score_segments``), the memory carried from each to the next. Calls are queued without
    waiting for their results (at most two ahead), which are read once, at the end. With a
    ``mesh`` (one process), parameters are laid out by the training rules and each batch's rows,
    and the memory's, are split over the batch axes when they divide them (else the batch is
    replicated): one CPU device per core (``cpu_devices``) then runs evaluation on every core.
    The windows (``_windows``) are each batch row's sums, batch by batch, or ``by_row``. With a
    ``progress`` (``PassProgress``, one process) of these calls, the blocks it kept are skipped and
    their sums and memory taken up, the sums and memory so far are kept whenever it is ``due`` and at the end: the
    caller removes them (``done``) once it has stored the result."""
    graphdef, state = nnx.split(model)
    if mesh is not None and jax.process_count() > 1:
        mesh = None  # each process's batches are its own rows; not placed on a global mesh
    if mesh is not None:
        state = jax.device_put(state, sharding.state_shardings(state, mesh))
    if jax.process_count() > 1:
        progress = None
    start = time.perf_counter()
    first, batches = _peek(batches)
    per_call = segments_per_call(first["weights"].size)
    calls = f"{per_call} segments of {first['weights'].shape} a call"
    kept, sums, kept_mems = progress.resumed(calls) if progress is not None else (0, [], None)
    kept_tokens = float(np.sum(sums[0]["row_count"])) if sums else 0.0
    mems, index = None, -1
    for index, block in enumerate(_blocks(batches, per_call)):
        if index < kept:
            continue
        if mems is None:
            mems = model.init_mems(block["inputs"].shape[1], mem_len, keys_values=True)
            mems = mems if kept_mems is None else eval_progress.restored(mems, kept_mems)
        if mesh is not None:
            block, mems = _placed(block, mems, mesh)
        with jax.set_mesh(mesh) if mesh is not None else contextlib.nullcontext():
            block_sums, mems = score_segments(graphdef, state, block, mems)
        sums.append(block_sums)
        if progress is not None and progress.due():
            sums = progress.keep(index + 1, sums, mems, calls)
        if len(sums) > 2:
            jax.block_until_ready(sums[-3])
    if progress is not None and index >= kept:  # the whole pass, until the caller stores it
        sums = progress.keep(index + 1, sums, mems, calls)
    total = {k: sum(np.asarray(s[k], np.float64) for s in sums) for k in sums[0] if "position" in k}
    window_loss, window_count = _windows(sums, by_row)
    total_count = float(window_count.sum())
    mean = float(math.fsum(window_loss) / total_count)
    seconds = time.perf_counter() - start
    by_position = total["position_loss"] / np.maximum(total["position_count"], 1.0)
    return {
        "loss": mean,
        "bpc": mean * BITS_PER_NAT,  # bits per token: per character (byte) at the byte level
        "bits_per_token": mean * BITS_PER_NAT,
        "ppl": math.exp(min(mean, 700.0)),
        "tokens": int(total_count),
        "tokens_per_sec": float((total_count - kept_tokens) / seconds),  # scored by this call
        # mean bits per token at each position of the segment, its first query first
        "bpc_by_position": [round(float(b) * BITS_PER_NAT, 5) for b in by_position],
        # each window's summed bits and scored tokens (the layout is set by the caller)
        "windows": {"bits": window_loss * BITS_PER_NAT, "tokens": window_count.astype(np.int64)},
    }


def _windows(sums: list[dict], by_row: bool) -> tuple[np.ndarray, np.ndarray]:
    """The row sums of every segment scored (``[S, B]`` a call) as windows ``[W]`` in float64:
    batch by batch, each batch's rows in order, or ``by_row`` (each row's segments in turn); those
    without a scored token (padding, which depends on the data alone) left out. -> (loss in nats,
    scored tokens)."""
    loss = np.concatenate([np.asarray(s["row_loss"], np.float64) for s in sums])  # [segments, B]
    count = np.concatenate([np.asarray(s["row_count"], np.float64) for s in sums])
    if by_row:
        loss, count = loss.T, count.T
    scored = count.ravel() > 0
    return loss.ravel()[scored], np.rint(count.ravel()[scored])


def _blocks(batches, size: int):
    """``batches`` stacked ``size`` at a time into ``[S, B, T]`` blocks, all of one shape: the last
    one is filled up with zero-weight segments (after every scored token, so they change nothing),
    unless there are fewer than ``size`` batches in all, which then make one block, or the filling
    would be more than ``FILL_AT_MOST`` tokens (long segments, where scoring them costs more than
    compiling a shorter block: 12 of 80 segments of 32,768 on a split of 68)."""
    batches = iter(batches)
    group = list(itertools.islice(batches, size))
    size = len(group)
    while group:
        missing = size - len(group)
        if missing * group[0]["weights"].size > FILL_AT_MOST:
            missing = 0  # a shorter last block
        fill = [{k: np.zeros_like(v) for k, v in group[0].items()}] * missing
        yield {k: np.stack([b[k] for b in group + fill]) for k in group[0]}
        group = list(itertools.islice(batches, size))


def _placed(block: dict, mems, mesh: jax.sharding.Mesh):
    rows = block["inputs"].shape[1]
    if rows % (mesh.shape["data"] * mesh.shape["fsdp"]):
        everywhere = sharding.replicated(mesh)
        return jax.device_put(block, everywhere), jax.device_put(mems, everywhere)
    return (
        jax.device_put(block, sharding.segments_sharding(mesh)),
        jax.device_put(mems, sharding.memory_sharding(mesh, keys_values=True)),
    )


def evaluate_split(
    model: TransformerLM,
    config: Config,
    split: str,
    *,
    settings: EvalSettings | None = None,
    max_tokens: int | None = None,
    scored_from: int = 0,
    mesh: jax.sharding.Mesh | None = None,
    progress: PassProgress | None = None,
) -> dict[str, Any]:
    """``evaluate`` on a split of ``config.data`` with ``settings`` (default
    ``EvalSettings.of(config)``), scoring the targets from offset ``scored_from`` of each segment;
    ``progress``: as ``evaluate``'s."""
    settings = settings or EvalSettings.of(config)
    stream = data_lib.open_data(config.data, split)
    data_lib.check_vocab_size(stream, config.model.vocab_size)
    return evaluate(
        with_config(model, settings.model_config(model.config)),
        stream,
        batch_size=settings.batch_size,
        segment_len=settings.segment_len,
        mem_len=settings.mem_len,
        max_tokens=max_tokens,
        scored_from=scored_from,
        mesh=mesh,
        progress=progress,
    )


def restore_model(config: Any, workdir) -> tuple[TransformerLM, Config, int]:
    """The model of the latest checkpoint in ``workdir`` (parameters only)."""
    from relpos_jax.checkpoint import restore_run_model

    cfg = Config.from_any(config)
    graphdef, model_state = nnx.split(TransformerLM(cfg.model, rngs=nnx.Rngs(0)))
    step, restored = restore_run_model(
        workdir, model_state, cfg, field="workdir",
        fix="train first (python train.py --config ... --workdir ...)",
    )  # fmt: skip
    return nnx.merge(graphdef, restored), cfg, step


def run_eval(model: TransformerLM, config: Config, splits, progress=None) -> dict[str, Any]:
    """Every token of each split once, with ``EvalSettings.of(config)``; the settings go in the
    results beside the scores. ``progress``: ``{split: PassProgress}`` where each split's pass is
    kept as it goes (``eval_results.split_progress``)."""
    settings = EvalSettings.of(config)
    results: dict[str, Any] = {"settings": dataclasses.asdict(settings)}
    try:
        mesh = sharding.make_mesh(config.mesh)
    except ConfigError:  # a training mesh these devices do not fit: evaluation needs none
        mesh = None
    if mesh is not None:
        sharding.check_context(
            mesh, config.model.attention_impl, segment_len=settings.segment_len,
            mem_len=settings.mem_len,
        )  # fmt: skip
    for split in splits:
        kept = (progress or {}).get(split)
        results[split] = evaluate_split(
            model, config, split, settings=settings, mesh=mesh, progress=kept
        )
    return results
