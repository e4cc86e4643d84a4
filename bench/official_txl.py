"""The official Transformer-XL code (kimiyoung/transformer-xl, ``pytorch/``) as a speed peer.

Its code is not part of this project: ``python -m bench.speed --official-txl DIR`` takes ``DIR``, the
``pytorch`` directory of a checkout of https://github.com/kimiyoung/transformer-xl, and runs its
``mem_transformer.MemTransformerLM`` as written (attention type 0: relative attention with the
global u/v biases, the pad-and-reshape shift, segment-level memory) at the sizes of ours. Two
allowances let 2019's code run on today's CPU PyTorch, both outside its files:

- ``utils/proj_adaptive_softmax.py`` parses ``torch.version.cuda`` when it is imported, and a CPU
  build has none: it reads "0.0" (the number only ever reached a comment);
- its attention masks are uint8, which ``masked_fill`` no longer accepts: they are read as bool, as
  PyTorch 1.x did.
"""

from __future__ import annotations

import contextlib
import functools
import pathlib
import sys

MODULE = "mem_transformer.py"


def missing(directory: str) -> str | None:
    """What is wrong with ``directory`` as the official code's ``pytorch`` folder, in one line."""
    if (pathlib.Path(directory).expanduser() / MODULE).is_file():
        return None
    return (
        f"--official-txl: no {MODULE} in {directory}; pass the pytorch/ directory of a checkout "
        "of https://github.com/kimiyoung/transformer-xl"
    )


@functools.cache  # once per checkout: the allowances and sys.path are process-wide
def load(directory: str):
    """The ``mem_transformer`` module of the checkout at ``directory`` (its ``pytorch`` folder)."""
    import torch

    if problem := missing(directory):
        raise FileNotFoundError(problem)
    root = pathlib.Path(directory).expanduser().resolve()
    if torch.version.cuda is None:
        torch.version.cuda = "0.0"
    _accept_byte_masks(torch)
    sys.path[:0] = [str(root), str(root / "utils")]  # it imports its utils/ modules by bare name
    import mem_transformer

    return mem_transformer


def _accept_byte_masks(torch) -> None:
    for name in ("masked_fill", "masked_fill_"):
        original = getattr(torch.Tensor, name)

        def accepting(self, mask, value, original=original):
            return original(self, mask.bool() if mask.dtype == torch.uint8 else mask, value)

        setattr(torch.Tensor, name, accepting)


def model(directory: str, size: dict, vocab: int, dropout: float):
    """``MemTransformerLM`` at ``size`` (a ``measure.SIZES`` entry): tied embedding and softmax,
    post-norm layers, no dropout on attention weights; initialised as its ``train.py`` does
    (normal, std 0.02), since its u/v biases are created uninitialised."""
    import torch

    torch.manual_seed(0)
    lm = load(directory).MemTransformerLM(
        vocab, size["layers"], size["heads"], size["d_model"], size["d_model"] // size["heads"],
        size["d_ff"], dropout, 0.0, tie_weight=True, tgt_len=size["seg"], ext_len=0,
        mem_len=size["mem"], cutoffs=[], attn_type=0,
    )  # fmt: skip
    for parameter in (lm.r_w_bias, lm.r_r_bias):
        torch.nn.init.normal_(parameter, 0.0, 0.02)
    return lm


def stepper(lm, task: str, dtype: str, size: dict, vocab: int):
    """A call that runs one training step of ``lm`` (forward, backward, Adam) or one evaluation pass
    on a segment of random tokens, carrying the memory from call to call; it returns the memory."""
    import torch

    data = torch.randint(0, vocab, (size["seg"] + 1, size["batch"]))  # time-major, as it reads
    inputs, targets = data[:-1], data[1:]
    autocast = (
        torch.autocast("cpu", dtype=torch.bfloat16)
        if dtype == "bfloat16"
        else contextlib.nullcontext()
    )
    carry = {"mems": ()}
    if task == "eval":
        lm.eval()

        def call():
            with torch.no_grad(), autocast:  # its forward computes the per-token loss itself
                _, *carry["mems"] = lm(inputs, targets, *carry["mems"])
            return carry["mems"]

        return call

    lm.train()
    optimizer = torch.optim.Adam(lm.parameters(), lr=2.5e-4)

    def call():
        with autocast:
            loss, *carry["mems"] = lm(inputs, targets, *carry["mems"])
            loss = loss.float().mean()
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        return carry["mems"]

    return call
