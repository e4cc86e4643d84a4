"""Word-level corpora: the paper's tokenisation and vocabulary against a plain reference, WikiText
folders and zips, vocabulary files, and a word-level run end to end (train, resume, evaluate)."""

from __future__ import annotations

import collections
import zipfile

import numpy as np
import pytest

from relpos_jax import data
from relpos_jax.data import builders, words
from relpos_jax.data.corpora import DataError
from relpos_jax.evaluate import restore_model, run_eval
from relpos_jax.train import Trainer
from tests.helpers import ROOT, logged_losses

SPLIT_FILES = {
    "train": "wiki.train.tokens",
    "valid": "wiki.valid.tokens",
    "test": "wiki.test.tokens",
}


def reference_ids(split_texts: dict[str, str]) -> tuple[list[str], dict[str, list[int]]]:
    """The official ``Vocab`` procedure written out plainly: count train's whitespace-split lines,
    ``<eos>`` first then ``most_common``; encode every line of a split with ``<eos>`` at its end."""
    counts = collections.Counter()
    for line in split_texts["train"].replace("\r\n", "\n").split("\n")[:-1]:
        counts.update(line.strip().split())
    vocab = ["<eos>"] + [w for w, _ in counts.most_common() if w != "<eos>"]
    if "<unk>" not in vocab:
        vocab.append("<unk>")
    index = {w: i for i, w in enumerate(vocab)}
    ids = {}
    for split, text in split_texts.items():
        lines = text.replace("\r\n", "\n").split("\n")[:-1]
        ids[split] = [index.get(w, index["<unk>"]) for ln in lines for w in [*ln.split(), "<eos>"]]
    return vocab, ids


def zipf_text(rng, n_lines: int, vocab: list[str]) -> str:
    weights = 1.0 / np.arange(1, len(vocab) + 1)
    lines = []
    for _ in range(n_lines):
        length = int(rng.integers(0, 12))  # some lines empty, as WikiText's are
        lines.append(" ".join(rng.choice(vocab, length, p=weights / weights.sum())))
    return "\n".join(lines) + "\n"


@pytest.fixture(scope="module")
def wikitext(tmp_path_factory):
    """A WikiText-shaped folder (wiki.*.tokens, with ``<unk>``, empty lines, a word that only valid
    has, a CRLF line and a U+2028 inside a line) and the same files zipped one folder deep."""
    root = tmp_path_factory.mktemp("wikitext")
    rng = np.random.default_rng(0)
    vocab = [f"w{i}" for i in range(60)] + ["<unk>", "=", "@-@", "."]
    texts = {
        split: zipf_text(rng, n, vocab)
        for split, n in [("train", 400), ("valid", 40), ("test", 40)]
    }
    texts["train"] += " = Heading = \r\nwith\u2028separator\n"
    texts["valid"] += "onlyvalid w1\n"
    folder = root / "wikitext-103"
    folder.mkdir()
    for split, text in texts.items():
        (folder / SPLIT_FILES[split]).write_bytes(text.encode())
    with zipfile.ZipFile(root / "wikitext-103-v1.zip", "w") as archive:
        for split in texts:
            archive.write(folder / SPLIT_FILES[split], f"wikitext-103/{SPLIT_FILES[split]}")
    return root, texts


def test_tokenisation_and_vocabulary_equal_the_reference(wikitext, tmp_path):
    root, texts = wikitext
    vocab, ids = reference_ids(texts)
    for split in ("train", "valid", "test"):
        stream = data.open_split(
            "wikitext103", split, path=str(root / "wikitext-103"), data_dir=str(tmp_path)
        )
        assert stream.vocabulary.words == vocab
        np.testing.assert_array_equal(stream.read(0, len(stream)), ids[split])
    assert vocab[0] == "<eos>" and "onlyvalid" not in vocab
    # U+2028 separates words but ends no line (as open() reads a file): one <eos> a "\n" line
    assert ids["train"].count(0) == texts["train"].count("\n") and "separator" in vocab


def test_vocabulary_order_is_count_then_first_appearance():
    lines = ["b a c\n", "c b\n", "\n", "d c\n"]
    assert words.build_vocabulary(lines) == ["<eos>", "c", "b", "a", "d", "<unk>"]
    assert [len(x) for x in words.Vocabulary(["<eos>", "a", "<unk>"]).encode_lines(lines)] == [
        4, 3, 1, 3,
    ]  # fmt: skip


def test_zip_folder_and_official_names_give_the_same_stream(wikitext, tmp_path):
    root, texts = wikitext
    renamed = tmp_path / "official"
    renamed.mkdir()
    for split, text in texts.items():  # the official getdata.sh renames them train.txt …
        (renamed / f"{split}.txt").write_bytes(text.encode())
    streams = [
        data.open_split("wikitext103", "valid", path=str(path), data_dir=str(tmp_path / "d"))
        for path in (root / "wikitext-103-v1.zip", root / "wikitext-103", renamed)
    ]
    first = streams[0].read(0, len(streams[0]))
    for stream in streams[1:]:
        np.testing.assert_array_equal(stream.read(0, len(stream)), first)


def test_byte_level_wikitext_is_the_file(wikitext, tmp_path):
    root, texts = wikitext
    stream = data.open_split(
        "wikitext103", "test", path=str(root), data_dir=str(tmp_path), tokens="bytes"
    )
    assert stream.vocabulary is None
    assert bytes(stream.read(0, len(stream))) == texts["test"].encode()


def test_word_level_text_splits_the_file_and_maps_unseen_words_to_unk(tmp_path):
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("a b a c\n" * 90 + "z z\n" * 10)
    train = data.open_split(
        "text", "train", path=str(corpus), data_dir=str(tmp_path), tokens="words"
    )
    test = data.open_split("text", "test", path=str(corpus), data_dir=str(tmp_path), tokens="words")
    assert train.vocabulary.words == ["<eos>", "a", "b", "c", "<unk>"]
    assert set(test.read(0, len(test)).tolist()) == {0, 4}  # z is unknown: <unk>, then <eos>


def test_a_vocabulary_file_fixes_the_ids(wikitext, tmp_path):
    root, _ = wikitext
    vocab_file = tmp_path / "vocab.txt"
    vocab_file.write_text("<unk>\n<eos>\nw0\nw1\n")
    stream = data.open_split(
        "wikitext103", "train", path=str(root), data_dir=str(tmp_path), vocab=str(vocab_file)
    )
    assert stream.vocabulary.words == ["<unk>", "<eos>", "w0", "w1"]
    decoded = stream.vocabulary.decode(stream.read(0, 200))
    assert set(decoded.split()) <= {"<unk>", "w0", "w1"}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, r"data\.vocab='.*missing\.txt' is invalid; no such file"),
        ("w0\n<eos>\n", r"lacks <unk>"),
        ("<eos>\n<unk>\n<eos>\n", r"a word appears twice"),
    ],
)
def test_bad_vocabulary_files_are_refused_in_one_line(wikitext, tmp_path, content, message):
    root, _ = wikitext
    path = tmp_path / "missing.txt"
    if content is not None:
        path.write_text(content)
    with pytest.raises(DataError, match=message) as error:
        data.open_split(
            "wikitext103", "train", path=str(root), data_dir=str(tmp_path), vocab=str(path)
        )
    assert "\n" not in str(error.value)


def test_missing_wikitext_names_the_download(tmp_path):
    with pytest.raises(DataError, match=r"wikitext-103-v1\.zip"):
        data.open_split("wikitext103", "train", data_dir=str(tmp_path))
    (tmp_path / "empty").mkdir()
    with pytest.raises(DataError, match=r"holds no wiki\.test\.tokens or test\.txt"):
        data.open_split(
            "wikitext103", "train", path=str(tmp_path / "empty"), data_dir=str(tmp_path)
        )


def test_records_cut_any_stream_into_whole_chunks():
    pieces = [np.arange(n, dtype=np.int32) for n in (3, 0, 9, 1, 7)]
    records = list(builders._records(pieces, np.int32, size=7))
    assert [len(r) for r in records] == [7, 7, 6]
    np.testing.assert_array_equal(np.concatenate(records), np.concatenate(pieces))
    assert [len(r) for r in builders._records([], np.int32, size=7)] == [0]


def test_text_encode_and_decode_round_trip():
    vocabulary = words.Vocabulary(["<eos>", "<unk>", "the", "cat"])
    ids = vocabulary.encode("the cat\nthe dog")
    assert ids.tolist() == [2, 3, 0, 2, 1]
    assert vocabulary.decode(ids) == "the cat\nthe <unk>"


def word_config(root, tmp_path, vocab_size: int):
    from relpos_jax.config import load_config

    config = load_config(ROOT / "configs" / "txl_base_wt103.py")
    config.model.update(
        vocab_size=vocab_size, n_layers=1, d_model=16, n_heads=2, d_ff=32, mem_len=6,
        cutoffs=(8, 20), div_val=2, tie_projs=(False, True, True), dropout=0.1,
    )  # fmt: skip
    config.data.update(path=str(root / "wikitext-103-v1.zip"), dir=str(tmp_path / "tfds"))
    config.data.update(segment_len=6, batch_size=4)
    config.train.update(steps=6, log_every=1, eval_every=3, eval_tokens=60, ckpt_every=3)
    config.eval.update(segment_len=5, mem_len=12, clamp_len=None, batch_size=3)
    return config


@pytest.mark.slow
def test_word_level_run_trains_resumes_and_evaluates(wikitext, tmp_path):
    root, texts = wikitext
    vocab, ids = reference_ids(texts)
    config = word_config(root, tmp_path, len(vocab))
    straight = Trainer(config, tmp_path / "straight").run()
    assert straight["step"] == 6 and np.isfinite(straight["valid_ppl"])
    assert Trainer(config, tmp_path / "resumed").run(stop_after=3) is None
    resumed = Trainer(config, tmp_path / "resumed")
    assert resumed.resumed_from == 3
    resumed.run()
    assert logged_losses(tmp_path / "resumed") == logged_losses(tmp_path / "straight")

    model, cfg, step = restore_model(config, tmp_path / "resumed")
    results = run_eval(model, cfg, ["valid", "test"])
    assert step == 6
    assert results["valid"]["tokens"] == len(ids["valid"]) - 1
    assert results["test"]["tokens"] == len(ids["test"]) - 1
    assert results["valid"]["ppl"] < len(vocab)  # better than uniform over the words
    assert results["valid"]["bits_per_token"] == pytest.approx(results["valid"]["loss"] / np.log(2))


def test_a_word_level_corpus_refuses_another_vocab_size(wikitext, tmp_path):
    root, texts = wikitext
    vocab, _ = reference_ids(texts)
    config = word_config(root, tmp_path, len(vocab) + 5)
    with pytest.raises(DataError, match=rf"model\.vocab_size={len(vocab) + 5} is invalid; .*"
                       rf"--config\.model\.vocab_size={len(vocab)}"):  # fmt: skip
        Trainer(config, tmp_path / "run")


@pytest.mark.parametrize(
    ("name", "millions"),
    [("txl_base_wt103", 151.1), ("txl_large_wt103", 285.2)],
)
def test_wt103_configs_build_the_papers_models(name, millions):
    """The base model has the paper's 151M parameters; the large one, counted the same way (every
    table, projection and bias of the official architecture), 285.2M where the paper's Table 1
    says 257M."""
    import jax
    from flax import nnx

    from relpos_jax.config import Config, load_config
    from relpos_jax.model import TransformerLM

    cfg = Config.from_any(load_config(ROOT / "configs" / f"{name}.py"))
    model = nnx.eval_shape(lambda: TransformerLM(cfg.model, rngs=nnx.Rngs(0)))
    count = sum(x.size for x in jax.tree.leaves(nnx.state(model, nnx.Param)))
    assert count / 1e6 == pytest.approx(millions, abs=0.05)


def official_reference(name: str, parts: list[bytes]) -> tuple[list[str], list[list[int]]]:
    """The official prep scripts and ``Vocab`` written out plainly: enwik8's bytes as numbers with
    line breaks as line ends, text8's characters with ``_`` for spaces; symbols counted over the
    three splits, ``most_common`` order; encoded without ``<eos>``."""
    texts = []
    for part in parts:
        if name == "enwik8":
            texts.append(" ".join(str(c) if c != ord("\n") else "\n" for c in part))
        else:
            texts.append(" ".join("_" if c == " " else c for c in part.decode().strip()))
    counts = collections.Counter()
    for text in texts:
        for line in text.split("\n"):
            counts.update(line.strip().split())
    vocab = [w for w, _ in counts.most_common()]
    index = {w: i for i, w in enumerate(vocab)}
    return vocab, [[index[w] for w in text.split()] for text in texts]


@pytest.mark.parametrize("name", ["enwik8", "text8"])
def test_official_symbols_equal_the_official_prep(name, tmp_path, monkeypatch):
    """enwik8 / text8 with ``data.tokens=symbols``, on a small file (the split shrunk to fit)."""
    from relpos_jax.data import corpora

    rng = np.random.default_rng(3)
    if name == "enwik8":  # skewed byte counts, line breaks and carriage returns among them
        weights = [0.1, 0.3, 0.1, 0.2, 0.1, 0.1, 0.05, 0.05]
        raw = bytes(rng.choice([10, 32, 60, 97, 98, 99, 200, 13], 1200, p=weights).tolist())
        raw = raw[:300] + bytes([203, 201]) + raw[300:1150] + bytes([202]) + raw[1150:]  # ties
    else:  # spaces at the ends of a split: the prep strips them
        raw = b" " + bytes(rng.choice(list(b"abcz "), 1200).tolist()) + b"  "
    (tmp_path / name).write_bytes(raw)
    monkeypatch.setitem(corpora.STANDARD_SPLIT, name, 1000)
    split_at = 1000 + (len(raw) - 1000) // 2
    vocab, ids = official_reference(name, [raw[:1000], raw[1000:split_at], raw[split_at:]])
    for split, expected in zip(("train", "valid", "test"), ids, strict=True):
        stream = data.open_split(
            name, split, path=str(tmp_path / name), data_dir=str(tmp_path / "d"), tokens="symbols"
        )
        assert stream.vocabulary.words == vocab
        np.testing.assert_array_equal(stream.read(0, len(stream)), expected)


def test_symbols_are_refused_for_other_corpora(tmp_path):
    with pytest.raises(DataError, match=r"data\.tokens='symbols' is invalid for text"):
        data.open_split(
            "text", "train", path=str(tmp_path), data_dir=str(tmp_path), tokens="symbols"
        )
