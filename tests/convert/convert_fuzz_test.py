"""The HuggingFace converter's inputs, broken every way a download or a hand edit breaks them:
truncated or garbled weights, a tensor missing, renamed, reshaped, non-finite or of another dtype,
config.json not JSON, a field missing or of any wrong type or value, a broken vocabulary. The
outcome of ``python -m relpos_jax.convert huggingface`` is one of two: converted (and then the run
directory is complete), or exit code 2 with one line naming the file and the fix, and nothing
written to ``--workdir``. The folders are written without transformers or torch (the weights as
``model.safetensors``), so that this runs in ``make test``.
"""

from __future__ import annotations

import collections
import json
import pickle

import numpy as np
import pytest

from relpos_jax.convert import huggingface
from relpos_jax.convert.__main__ import main
from relpos_jax.convert.common import Tensors

safetensors_numpy = pytest.importorskip("safetensors.numpy")

# Two small transfo-xl configs: bytes with a tied softmax and per-layer u, v; an adaptive softmax
# (div_val 2, projections shared but the first) with shared u, v.
CONFIGS = {
    "plain": dict(
        n_layer=2, d_model=16, n_head=2, d_head=8, d_inner=32, vocab_size=40, cutoffs=[],
        tie_word_embeddings=True, untie_r=True, mem_len=8, clamp_len=-1,
    ),
    "adaptive": dict(
        n_layer=1, d_model=16, n_head=2, d_head=8, d_inner=32, vocab_size=60, cutoffs=[20, 40],
        div_val=2, d_embed=16, tie_projs=[False, True, True], tie_word_embeddings=True,
        untie_r=False, mem_len=8, same_length=True,
    ),
}  # fmt: skip
WRONG_VALUES = ("x", None, -1, 0, 2.5, [1], {"a": 1}, 10**12, True)
KEYS = (
    "n_layer", "d_model", "n_head", "d_head", "d_inner", "vocab_size", "cutoffs", "div_val",
    "d_embed", "tie_projs", "mem_len", "clamp_len", "same_length", "untie_r",
    "tie_word_embeddings", "attn_type", "sample_softmax", "pre_lnorm", "layer_norm_epsilon",
    "model_type",
)  # fmt: skip


class _Recorder(Tensors):
    """Every tensor the converter asks for, with the shape it asks for: a valid folder's weights."""

    def __init__(self):
        super().__init__("recorder", {}, None, "")

    def get(self, name, shape, fields):
        self.shapes[name] = tuple(shape)
        self.used.add(name)
        return np.zeros(shape, np.float32)


def _valid(name: str) -> tuple[dict, dict[str, np.ndarray], list[str]]:
    """config.json, the weights and the vocabulary of a folder that converts."""
    config = {"model_type": "transfo-xl", **CONFIGS[name]}
    recorder = _Recorder()
    huggingface.convert_params(huggingface.model_fields(config), recorder)
    rng = np.random.default_rng(0)
    weights = {k: rng.normal(size=s).astype(np.float32) for k, s in sorted(recorder.shapes.items())}
    return config, weights, [f"w{i}" for i in range(config["vocab_size"])]


def _cases() -> list[tuple[str, str, object]]:
    """(config, what is broken, how): every case, by name, built into a folder by ``_folder``."""
    cases = []
    for name in CONFIGS:
        _, weights, _ = _valid(name)
        cases.append((name, "nothing", None))
        for cut in (0, 7, 8, 100, -1):
            cases.append((name, "weights truncated", cut))
        cases += [(name, "weights garbled", "header"), (name, "weights garbled", "noise")]
        cases += [(name, "no weights", None), (name, "extra tensor", "crit.unknown")]
        for tensor in weights:
            cases.append((name, "tensor missing", tensor))
            cases.append((name, "tensor reshaped", tensor))
            cases.append((name, "tensor renamed", tensor))
        for tensor in list(weights)[:3]:
            cases += [(name, "tensor non-finite", tensor), (name, "tensor float16", tensor)]
            cases.append((name, "tensor int64", tensor))
        for text in ("", "{", "[1, 2]", '"transfo-xl"', "7", "\xff"):
            cases.append((name, "config.json text", text))
        for key in KEYS:
            cases.append((name, "config.json key missing", key))
            for value in WRONG_VALUES:
                cases.append((name, "config.json value", (key, value)))
        for vocab in ("truncated", "garbage", "a list", "too short", "newline", "counter"):
            cases.append((name, "vocab.pkl", vocab))
    return cases


def broken_weights(weights: dict, broken: str, how) -> dict[str, np.ndarray]:
    """``weights`` with tensor ``how`` missing, reshaped, renamed, non-finite, float16 or int64, or
    an extra tensor ``how`` (``broken``); as they are for any other case."""
    weights = dict(weights)
    if broken == "tensor missing":
        del weights[how]
    elif broken == "tensor reshaped":
        weights[how] = np.zeros((*weights[how].shape, 2), np.float32)
    elif broken == "tensor renamed":
        weights[how + ".renamed"] = weights.pop(how)
    elif broken == "tensor non-finite":
        weights[how] = weights[how].copy()
        weights[how].flat[1] = np.nan
    elif broken == "tensor float16":
        weights[how] = weights[how].astype(np.float16)
    elif broken == "tensor int64":
        weights[how] = weights[how].astype(np.int64)
    elif broken == "extra tensor":
        weights[how] = np.zeros(3, np.float32)
    return weights


def _folder(path, name: str, broken: str, how) -> None:
    config, weights, symbols = _valid(name)
    weights = broken_weights(weights, broken, how)
    vocab = pickle.dumps({"idx2sym": symbols})
    if broken == "config.json key missing":
        config.pop(how, None)
    elif broken == "config.json value":
        config[how[0]] = how[1]
    elif broken == "vocab.pkl":
        vocab = {
            "truncated": vocab[: len(vocab) // 2],
            "garbage": b"\x80\x05garbage",
            "a list": pickle.dumps(symbols),
            "too short": pickle.dumps({"idx2sym": symbols[:-1]}),
            "newline": pickle.dumps({"idx2sym": ["a\nb", *symbols[1:]]}),
            "counter": pickle.dumps({"idx2sym": symbols, "counter": collections.Counter("ab")}),
        }[how]
    path.mkdir()
    text = json.dumps(config) if broken != "config.json text" else how
    (path / "config.json").write_text(text, encoding="utf-8", errors="surrogateescape")
    (path / "vocab.pkl").write_bytes(vocab)
    if broken == "no weights":
        return
    safetensors_numpy.save_file(weights, str(path / "model.safetensors"))
    if broken == "weights truncated":
        data = (path / "model.safetensors").read_bytes()
        (path / "model.safetensors").write_bytes(data[:how])
    elif broken == "weights garbled":
        data = bytearray((path / "model.safetensors").read_bytes())
        if how == "header":
            data[8:24] = b"#" * 16
        else:
            data[:] = np.random.default_rng(1).integers(0, 256, len(data), np.uint8).tobytes()
        (path / "model.safetensors").write_bytes(bytes(data))


CASES = _cases()


def _must_refuse(broken: str, how) -> bool:
    """A case whose weights or vocabulary are broken (a float16 tensor and a Counter beside the
    symbols are not): it converts only by mistake. A config.json edit may leave a valid model."""
    if broken.startswith(("weights", "no weights", "extra", "tensor")):
        return broken != "tensor float16"
    return broken == "vocab.pkl" and how != "counter"


def test_every_broken_input_is_one_line_and_writes_nothing(tmp_path, capsys):
    """Every case in one test (a conversion that succeeds compiles; a refusal is fast): converted,
    with the run directory complete, or one line and exit code 2 with ``--workdir`` not created.
    The tally is what docs/reliability.md reports."""
    outcomes = collections.Counter()
    for index, (name, broken, how) in enumerate(CASES):
        source, workdir = tmp_path / f"source{index}", tmp_path / f"run{index}"
        _folder(source, name, broken, how)
        case = f"{name}: {broken} {how!r}"
        code = main(["huggingface", "--source", str(source), "--workdir", str(workdir)])
        _, err = capsys.readouterr()
        if code == 0:
            assert not _must_refuse(broken, how), case
            assert (workdir / "config.py").is_file() and (workdir / "vocab.txt").is_file(), case
            outcomes["converted"] += 1
            continue
        lines = err.splitlines()
        assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (case, err)
        assert "Traceback" not in err and not workdir.exists(), case
        outcomes["refused"] += 1
    assert outcomes == {"converted": 56, "refused": 565}, outcomes
