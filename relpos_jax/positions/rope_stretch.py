"""The HuggingFace ``rope_scaling`` dict that stretches a RoPE model trained at length L₀ by a
factor, for each length extension: what ``model.rope_scaling`` takes, zero-shot or for a fine-tune.

- ``linear``: position interpolation (Chen et al. 2023), every frequency divided by the factor;
- ``ntk``: NTK-aware, the base raised so that the lowest frequency is interpolated (bloc97 2023);
- ``dynamic``: NTK with the factor taken from the current length (at evaluation);
- ``yarn`` (Peng et al. 2023): frequencies that turn more than β_fast times over L₀ kept, those that
  turn fewer than β_slow times interpolated, a ramp between, and a temperature on the logits;
- ``llama3``: Llama 3.1's wavelength bands at L₀ (low 1, high 4).

YaRN's β are rotation counts over L₀: its defaults (32, 1) were chosen for LLaMA 2 (L₀ = 4,096,
head dim 128). ``yarn_betas`` scales them to L₀ so that the same share of the head's frequencies is
kept, ramped and interpolated; the frequencies are fractions of the head dim, so the head dim does
not change the share.
"""

from __future__ import annotations

from typing import Any

STRETCHES = ("linear", "ntk", "dynamic", "yarn", "llama3")
YARN_DEFAULT_LENGTH = 4096  # the L₀ that YaRN's β_fast = 32, β_slow = 1 were chosen for (LLaMA 2)


def yarn_betas(trained_len: int) -> dict[str, float]:
    """YaRN's ``beta_fast`` and ``beta_slow`` for a model trained at ``trained_len``: the defaults'
    rotation counts scaled by ``trained_len / 4096``, so that the dimensions kept, ramped and
    interpolated are the same share of the head as for LLaMA 2 (1 and 1/32 at 128)."""
    scale = trained_len / YARN_DEFAULT_LENGTH
    return {"beta_fast": 32 * scale, "beta_slow": 1 * scale}


def stretched(kind: str, factor: float, trained_len: int) -> dict[str, Any] | None:
    """The ``rope_scaling`` dict of ``kind`` stretching a model trained at ``trained_len`` by
    ``factor`` (None at a factor of 1 or less: RoPE as trained)."""
    if kind not in STRETCHES:
        raise ValueError(f"kind={kind!r} is not a RoPE stretch; use one of {', '.join(STRETCHES)}")
    if factor <= 1:
        return None
    if kind in ("linear", "ntk"):
        return {"rope_type": kind, "factor": float(factor)}
    scaling = {
        "rope_type": kind, "factor": float(factor), "original_max_position_embeddings": trained_len
    }  # fmt: skip
    if kind == "llama3":
        scaling.update(low_freq_factor=1.0, high_freq_factor=4.0)
    if kind == "yarn":
        scaling.update(yarn_betas(trained_len))
    return scaling
