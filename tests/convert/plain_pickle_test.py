"""A vocabulary pickle is read as plain data (``convert.plain_pickle``): a crafted file that would
write a file (or run anything) is refused in one line and nothing it names runs; the released
files' Counter and OrderedDict still load."""

from __future__ import annotations

import collections
import pathlib
import pickle

import pytest

from relpos_jax.convert import plain_pickle
from relpos_jax.convert.common import ConvertError
from relpos_jax.convert.huggingface import read_vocab


class _WritesAFile:
    """Unpickled by ``pickle.load``, this writes ``target``: what a crafted vocab.pkl could do."""

    def __init__(self, target: pathlib.Path):
        self.target = target

    def __reduce__(self):
        return pathlib.Path.write_text, (self.target, "ran")


def test_a_crafted_vocabulary_is_refused_in_one_line_and_nothing_runs(tmp_path):
    target = tmp_path / "written_by_the_pickle"
    folder = tmp_path / "model"
    folder.mkdir()
    crafted = pickle.dumps({"idx2sym": ["a"], "payload": _WritesAFile(target)})
    pickle.loads(crafted)  # the crafted file does what it says with pickle.load…
    assert target.read_text() == "ran"
    target.unlink()
    (folder / "vocab.pkl").write_bytes(crafted)
    with pytest.raises(ConvertError) as error:  # …and is refused here, nothing run
        read_vocab(folder)
    message = str(error.value)
    assert "\n" not in message and "vocab.pkl is refused" in message
    assert "pathlib.Path.write_text" in message or "pathlib" in message
    assert not target.exists()


@pytest.mark.parametrize(
    "module, name", [("os", "system"), ("builtins", "eval"), ("subprocess", "Popen")]
)
def test_every_name_outside_plain_data_is_refused(module, name):
    crafted = f"c{module}\n{name}\n(S'true'\ntR.".encode()  # protocol 0: module.name('true')
    with pytest.raises(plain_pickle.RefusedPickle, match=f"{module}.{name}"):
        plain_pickle.loads(crafted)


def test_the_released_vocabularys_containers_load(tmp_path):
    vocab = {
        "idx2sym": ["<eos>", "the", ","],
        "sym2idx": collections.OrderedDict([("<eos>", 0), ("the", 1), (",", 2)]),
        "counter": collections.Counter({"the": 5, ",": 3}),
        "special": ["<eos>"], "min_freq": 0, "max_size": None, "lower_case": False,
        "delimiter": None, "never_split": {"<unk>"},
    }  # fmt: skip
    for protocol in (2, pickle.HIGHEST_PROTOCOL):
        (tmp_path / "vocab.pkl").write_bytes(pickle.dumps(vocab, protocol=protocol))
        assert plain_pickle.load(tmp_path / "vocab.pkl") == vocab
        assert read_vocab(tmp_path) == ["<eos>", "the", ","]


def test_a_file_that_is_no_pickle_is_one_line(tmp_path):
    (tmp_path / "vocab.pkl").write_bytes(b"\x00not a pickle")
    with pytest.raises(ConvertError, match=r"vocab\.pkl is not a readable pickle") as error:
        read_vocab(tmp_path)
    assert "\n" not in str(error.value)
