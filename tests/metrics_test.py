"""The metrics file (``relpos_jax.metrics``) survives a kill in the middle of a record."""

from __future__ import annotations

from relpos_jax.metrics import MetricsWriter, read_metrics


def test_a_record_cut_by_a_kill_is_dropped_and_the_file_stays_valid(tmp_path):
    writer = MetricsWriter(tmp_path)
    writer.write(1, {"train/loss": 1.5})
    writer.close()
    with (tmp_path / "metrics.jsonl").open("a") as file:
        file.write('{"step": 2, "train/lo')  # the kill landed here
    writer = MetricsWriter(tmp_path)
    writer.write(2, {"train/loss": 1.25})
    writer.close()
    assert read_metrics(tmp_path) == [
        {"step": 1, "train/loss": 1.5},
        {"step": 2, "train/loss": 1.25},
    ]
