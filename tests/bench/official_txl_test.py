"""bench/official_txl.py drives the official Transformer-XL code through its interface.

The official code is not part of the project (nor downloadable where the tests run), so a stand-in
checkout plays it here: the same constructor and ``forward(data, target, *mems) -> [loss] +
new_mems``, time-major inputs, a ``utils/`` module imported by bare name that parses
``torch.version.cuda`` at import, uint8 attention masks and u/v biases created uninitialised — each
of what the driver has to meet in the real code. With ``OFFICIAL_TXL_DIR`` set to the ``pytorch/``
folder of a checkout of https://github.com/kimiyoung/transformer-xl, the same checks also run on the
official code itself. Each run is its own process: loading patches ``torch.Tensor.masked_fill`` and
``sys.path``.

These tests need the bench extra (CPU PyTorch), which ``make test`` and CI do not install; ``make
test-peers`` installs it and runs them (``make test-peers OFFICIAL_TXL_DIR=…/pytorch`` for the real
code).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys

import pytest

from tests.helpers import ROOT

STAND_IN = """
import torch
import torch.nn.functional as F
from proj_adaptive_softmax import CUDA_MAJOR  # noqa: F401  (utils/, by bare name, as the real one)


class MemTransformerLM(torch.nn.Module):
    def __init__(self, n_token, n_layer, n_head, d_model, d_head, d_inner, dropout, dropatt,
                 tie_weight=True, tgt_len=None, ext_len=None, mem_len=None, cutoffs=[],
                 attn_type=0):
        super().__init__()
        assert attn_type == 0 and tie_weight and cutoffs == [] and n_head * d_head == d_model
        self.n_layer, self.mem_len = n_layer, mem_len
        self.emb = torch.nn.Embedding(n_token, d_model)
        self.ff = torch.nn.Linear(d_model, d_inner)
        self.out = torch.nn.Linear(d_inner, d_model)
        self.drop = torch.nn.Dropout(dropout)
        self.r_w_bias = torch.nn.Parameter(torch.Tensor(n_head, d_head).fill_(float("nan")))
        self.r_r_bias = torch.nn.Parameter(torch.Tensor(n_head, d_head).fill_(float("nan")))

    def forward(self, data, target, *mems):
        qlen, bsz = data.shape
        h = self.drop(self.emb(data))
        klen = qlen + (mems[0].size(0) if mems else 0)
        window = torch.cat([mems[0], h], 0) if mems else h
        mask = torch.triu(h.new_ones(qlen, klen), diagonal=1 + klen - qlen).byte()[:, :, None]
        score = torch.einsum("ibd,jbd->ijb", h + self.r_w_bias.reshape(-1), window)
        score = score.float().masked_fill(mask, -float("inf")).type_as(score)
        h = h + torch.einsum("ijb,jbd->ibd", F.softmax(score, dim=1), window)
        h = h + self.out(F.relu(self.ff(h + self.r_r_bias.reshape(-1))))
        logits = h @ self.emb.weight.t()
        loss = F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), target.reshape(-1),
                               reduction="none").view(qlen, bsz)
        new_mems = [h.detach()[-self.mem_len:] for _ in range(self.n_layer + 1)]
        return [loss] + new_mems
"""

DRIVER = """
import json, sys, torch
sys.path.insert(0, {root!r})
from bench import official_txl
size = dict(layers=2, d_model=16, heads=2, d_ff=32, seg=6, mem=6, batch=3)
report = {{}}
for task in ("train", "eval"):
    lm = official_txl.model({directory!r}, size, 11, dropout=0.1)
    before = [p.detach().clone() for p in lm.parameters()]
    call = official_txl.stepper(lm, task, {dtype!r}, size, 11)
    first, second = call(), call()
    report[task] = dict(
        mems=[list(m.shape) for m in second],
        carried=all(not torch.equal(a, b) for a, b in zip(first, second)),
        changed=any(not torch.equal(a, p) for a, p in zip(before, lm.parameters())),
        finite=all(bool(torch.isfinite(p).all()) for p in lm.parameters()),
        training=lm.training,
    )
print(json.dumps(report))
"""


def stand_in_checkout(root):
    """A ``pytorch/`` folder shaped like kimiyoung/transformer-xl's, with the stand-in model."""
    pytorch = root / "transformer-xl" / "pytorch"
    (pytorch / "utils").mkdir(parents=True)
    (pytorch / "mem_transformer.py").write_text(STAND_IN)
    (pytorch / "utils" / "proj_adaptive_softmax.py").write_text(
        "import torch\nCUDA_MAJOR = int(torch.version.cuda.split('.')[0])\n"
    )
    return pytorch


NEEDS_TORCH = "the bench extra (CPU PyTorch) is not installed; run `make test-peers`"


def official_checkout() -> pathlib.Path:
    """The ``pytorch/`` folder named by ``OFFICIAL_TXL_DIR``, or a skip that says how to name one."""
    directory = os.environ.get("OFFICIAL_TXL_DIR")
    if not directory:
        pytest.skip(
            "OFFICIAL_TXL_DIR is not set; run `make test-peers OFFICIAL_TXL_DIR=<checkout of "
            "kimiyoung/transformer-xl>/pytorch` to drive the official code itself"
        )
    path = pathlib.Path(directory).expanduser()
    assert (path / "mem_transformer.py").is_file(), (
        f"OFFICIAL_TXL_DIR={directory}: no mem_transformer.py"
    )
    return path


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("checkout", ["stand-in", "official"])
def test_official_txl_steps_carry_memory_and_train(tmp_path, checkout, dtype):
    pytest.importorskip("torch", reason=NEEDS_TORCH)
    directory = stand_in_checkout(tmp_path) if checkout == "stand-in" else official_checkout()
    script = DRIVER.format(root=str(ROOT), directory=str(directory), dtype=dtype)
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads(result.stdout.strip().splitlines()[-1])
    assert report["train"]["mems"] == [[6, 3, 16]] * 3  # n_layer + 1 memories, time-major
    assert report["eval"]["mems"] == [[6, 3, 16]] * 3
    assert report["train"]["carried"]  # the second segment's memory is not the first's
    assert report["train"]["changed"] and not report["eval"]["changed"]
    assert report["train"]["training"] and not report["eval"]["training"]
    assert report["train"]["finite"] and report["eval"]["finite"]  # u/v biases initialised


def test_speed_rejects_a_directory_without_the_official_code(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "bench.speed", "--official-txl", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .endswith(
            f"error: --official-txl: no mem_transformer.py in {tmp_path}; pass the pytorch/ "
            "directory of a checkout of https://github.com/kimiyoung/transformer-xl"
        )
    )
