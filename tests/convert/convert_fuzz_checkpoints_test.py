"""The converters' other inputs broken every way a download or a hand edit breaks them: the official
TensorFlow checkpoint (``…/model.ckpt-0.index`` and ``.data-…``) and HuggingFace's
``pytorch_model.bin`` (a ``torch.save`` file). Files truncated or garbled, a variable or tensor
missing, renamed, reshaped, non-finite or of another dtype, an extra one, a checkpoint the config
does not describe, a ``.bin`` that is not a state dict. The outcome of ``python -m
relpos_jax.convert`` is converted (the run directory complete) or exit code 2 with one line, and
nothing written to ``--workdir``. Needs the convert extra (TensorFlow, torch): ``make test-convert``
(``convert_fuzz_test.py`` does the same for ``model.safetensors`` in ``make test``).
"""

from __future__ import annotations

import collections
import json
import pickle

import numpy as np
import pytest

from relpos_jax.config import Config, load_config
from relpos_jax.convert import tensorflow
from relpos_jax.convert.__main__ import main
from tests.convert.convert_fuzz_test import _Recorder, broken_weights
from tests.convert.convert_fuzz_test import _valid as _hf_folder
from tests.helpers import ROOT

EXTRA = "needs the convert extra (make test-convert)"
# the TensorFlow route: a small model given by overrides of configs/base.py (the checkpoint has no
# config), with per-layer biases, and with an adaptive softmax and shared ones
TF_MODELS = {
    "plain": ["model.position=txl", "model.n_layers=2", "model.d_model=16", "model.n_heads=2",
              "model.d_head=8", "model.d_ff=32", "model.vocab_size=40", "model.txl.untie_r=True",
              "model.output_bias=True"],
    "adaptive": ["model.position=txl", "model.n_layers=1", "model.d_model=16", "model.n_heads=2",
                 "model.d_head=8", "model.d_ff=32", "model.vocab_size=60", "model.cutoffs=(20, 40)",
                 "model.div_val=2", "model.d_embed=16", "model.tie_projs=(False, True, True)",
                 "model.txl.untie_r=False"],
}  # fmt: skip
# a config that does not describe the checkpoint: refused, whichever field
MISMATCHES = ("model.n_layers=3", "model.d_model=32", "model.n_heads=4", "model.d_ff=64",
              "model.vocab_size=41", "untie_r flipped")  # fmt: skip
CUTS = (0, 7, 8, 100, -1)


def _weights(shapes: dict) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(0)
    return {k: rng.normal(size=s).astype(np.float32) for k, s in sorted(shapes.items())}


def _tf_valid(name: str) -> dict[str, np.ndarray]:
    config = load_config(ROOT / "configs" / "base.py", TF_MODELS[name])
    recorder = _Recorder()
    tensorflow.convert_params(Config.from_any(config), recorder)
    return _weights(recorder.shapes)


def _hf_valid(name: str) -> tuple[dict, dict[str, np.ndarray]]:
    config, weights, _ = _hf_folder(name)  # convert_fuzz_test's valid folder
    return config, weights


def _tensor_cases(weights) -> list[tuple[str, object]]:
    cases = [("nothing", None), ("extra tensor", "transformer/unknown")]
    for tensor in weights:
        cases += [("tensor missing", tensor), ("tensor reshaped", tensor),
                  ("tensor renamed", tensor)]  # fmt: skip
    for tensor in list(weights)[:3]:
        cases += [("tensor non-finite", tensor), ("tensor float16", tensor),
                  ("tensor int64", tensor)]  # fmt: skip
    return cases


def _damage(path, broken: str, how) -> None:
    data = bytearray(path.read_bytes())
    if broken.endswith("truncated"):
        path.write_bytes(bytes(data[:how]))
    elif broken.endswith("garbled"):
        data[:] = np.random.default_rng(1).integers(0, 256, len(data), np.uint8).tobytes()
        path.write_bytes(bytes(data))
    elif broken.endswith("missing"):
        path.unlink()


# ---------------------------------------------------------------------------- TensorFlow


def _tf_cases() -> list[tuple[str, str, object]]:
    cases = []
    for name in TF_MODELS:
        weights = _tf_valid(name)
        cases += [(name, broken, how) for broken, how in _tensor_cases(weights)]
        cases += [(name, "optimizer slot", "transformer/r_w_bias/Adam_1")]
        for part in ("index", "data"):
            cases += [(name, f"{part} truncated", cut) for cut in CUTS]
            cases += [(name, f"{part} garbled", None), (name, f"{part} missing", None)]
        cases += [(name, "config", field) for field in MISMATCHES]
        cases += [(name, "source", kind) for kind in ("empty folder", "no such prefix")]
    return cases


def _tf_checkpoint(tf, variables: dict, prefix) -> str:
    saver = tf.compat.v1.train.Saver(
        var_list={name: tf.Variable(value) for name, value in variables.items()}
    )
    return saver.save(None, str(prefix), write_meta_graph=False)


def _tf_must_refuse(broken: str) -> bool:
    return broken not in ("nothing", "optimizer slot", "tensor float16")


def test_every_broken_tensorflow_checkpoint_is_one_line_and_writes_nothing(tmp_path, capsys):
    tf = pytest.importorskip("tensorflow", reason=EXTRA)
    outcomes = collections.Counter()
    for index, (name, broken, how) in enumerate(_tf_cases()):
        weights = _tf_valid(name)
        if broken == "optimizer slot":
            weights[how] = np.zeros(3, np.float32)
        weights = broken_weights(weights, broken, how)
        folder, workdir = tmp_path / f"source{index}", tmp_path / f"run{index}"
        prefix = _tf_checkpoint(tf, weights, folder / "model.ckpt-0")
        overrides = list(TF_MODELS[name])
        if broken == "config":
            flipped = "model.txl.untie_r=False" if name == "plain" else "model.txl.untie_r=True"
            overrides.append(flipped if how == "untie_r flipped" else how)
        if broken.startswith("index"):
            _damage(folder / "model.ckpt-0.index", broken, how)
        elif broken.startswith("data"):
            _damage(next(folder.glob("model.ckpt-0.data-*")), broken, how)
        source = prefix
        if broken == "source":
            source = str(tmp_path / "empty") if how == "empty folder" else prefix + "x"
            (tmp_path / "empty").mkdir(exist_ok=True)
        argv = ["tensorflow", "--source", source, "--workdir", str(workdir),
                "--config", str(ROOT / "configs" / "base.py")]  # fmt: skip
        for override in overrides:
            argv += ["--override", override]
        outcomes[_outcome(argv, workdir, capsys, f"{name}: {broken} {how!r}",
                          _tf_must_refuse(broken))] += 1  # fmt: skip
    assert outcomes == {"converted": 10, "refused": 205}, outcomes


# ---------------------------------------------------------------------------- pytorch_model.bin


class _Custom:
    """Not a tensor: ``torch.load(weights_only=True)`` refuses to build it."""


def _bin_cases() -> list[tuple[str, str, object]]:
    cases = []
    for name in ("plain", "adaptive"):
        _, weights = _hf_valid(name)
        cases += [(name, broken, how) for broken, how in _tensor_cases(weights)]
        cases += [(name, "bin truncated", cut) for cut in CUTS]
        cases += [(name, "bin garbled", None)]
        cases += [(name, "bin holds", kind) for kind in ("a list", "a tensor", "an object",
                                                          "code", "bfloat16")]  # fmt: skip
    return cases


def _bin_must_refuse(broken: str, how) -> bool:
    if broken == "bin holds":
        return how != "bfloat16"
    return broken not in ("nothing", "tensor float16")


def test_every_broken_pytorch_model_bin_is_one_line_and_writes_nothing(tmp_path, capsys):
    torch = pytest.importorskip("torch", reason=EXTRA)
    outcomes = collections.Counter()
    marker = tmp_path / "ran"
    for index, (name, broken, how) in enumerate(_bin_cases()):
        config, weights = _hf_valid(name)
        folder, workdir = tmp_path / f"source{index}", tmp_path / f"run{index}"
        folder.mkdir()
        (folder / "config.json").write_text(json.dumps(config))
        (folder / "vocab.pkl").write_bytes(pickle.dumps({"idx2sym": [f"w{i}" for i in range(
            config["vocab_size"])]}))  # fmt: skip
        state = {k: torch.from_numpy(v) for k, v in broken_weights(weights, broken, how).items()}
        if broken == "bin holds":
            first = next(iter(state))
            state = {
                "a list": list(state.values()),
                "a tensor": state[first],
                "an object": {**state, first: _Custom()},
                "code": _RunsCode(marker),
                "bfloat16": {k: v.to(torch.bfloat16) for k, v in state.items()},
            }[how]
        torch.save(state, folder / "pytorch_model.bin")
        _damage(folder / "pytorch_model.bin", broken, how)
        argv = ["huggingface", "--source", str(folder), "--workdir", str(workdir)]
        outcomes[_outcome(argv, workdir, capsys, f"{name}: {broken} {how!r}",
                          _bin_must_refuse(broken, how))] += 1  # fmt: skip
    assert not marker.exists()  # the pickle's code never ran
    assert outcomes == {"converted": 10, "refused": 193}, outcomes


class _RunsCode:
    """A pickle that would write a file when loaded (``__reduce__`` calls ``open``)."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return open, (str(self.path), "w")


def _outcome(argv, workdir, capsys, case: str, must_refuse: bool) -> str:
    capsys.readouterr()  # what writing the checkpoint printed
    code = main(argv)
    _, err = capsys.readouterr()
    if code == 0:
        assert not must_refuse, case
        assert (workdir / "config.py").is_file(), case
        return "converted"
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (case, err)
    assert "Traceback" not in err and not workdir.exists(), case
    return "refused"
