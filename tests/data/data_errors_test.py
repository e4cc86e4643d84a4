"""Data faults (``relpos_jax.data``) end in one line that names the file or the field and the cause;
on the command line, exit code 2 and no file of the work directory changed."""

from __future__ import annotations

import pathlib
import shutil

import pytest

from relpos_jax import data
from relpos_jax.train import Trainer
from tests.helpers import files_under, run_cli, tiny_flags


def test_unreadable_file_in_a_text_folder_is_one_line(tmp_path, monkeypatch):
    (tmp_path / "corpus").mkdir()
    (tmp_path / "corpus" / "a.txt").write_bytes(b"fine text\n" * 100)
    (tmp_path / "corpus" / "b.txt").write_bytes(b"\xff\xfe not utf-8 \x80" * 100)
    real_read = pathlib.Path.read_bytes

    def read_bytes(path):
        if path.name == "b.txt":
            raise PermissionError(13, "Permission denied", str(path))
        return real_read(path)

    monkeypatch.setattr(pathlib.Path, "read_bytes", read_bytes)
    with pytest.raises(data.DataError) as error:
        data.open_split("text", "train", path=str(tmp_path / "corpus"), data_dir=str(tmp_path))
    message = str(error.value)
    assert "b.txt" in message and "Permission denied" in message and "\n" not in message


@pytest.mark.slow
def test_a_dataset_that_became_empty_fails_in_one_line_and_damages_nothing(tiny, tmp_path):
    config, _ = tiny
    corpus = tmp_path / "corpus.txt"
    shutil.copy(config.data.path, corpus)
    config = config.copy_and_resolve_references()
    config.data.path = str(corpus)
    config.train.update(steps=2, eval_every=0)
    Trainer(config, tmp_path / "run").run()
    written = {p: p.read_bytes() for p in files_under(tmp_path / "run")}
    corpus.write_bytes(b"")  # emptied (or truncated) between two runs
    flags = [*tiny_flags(config, tmp_path / "run"), f"--config.data.path={corpus}"]
    result = run_cli("train.py", *flags, "--config.train.steps=4")
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and len(errors) == 1 and "Traceback" not in result.stderr
    assert "data.batch_size=4 is invalid for a split of 0 tokens" in errors[0], errors
    assert {p: p.read_bytes() for p in files_under(tmp_path / "run")} == written
