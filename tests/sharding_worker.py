"""Run in a subprocess by sharding_test.py, with simulated CPU devices (XLA_FLAGS set by the caller).

    python tests/sharding_worker.py meshes WORKDIR          # 8 devices: meshes vs one device
    python tests/sharding_worker.py train WORKDIR STOP [COORDINATOR NPROC PID]

Prints one JSON line with what the test checks.
"""

from __future__ import annotations

import json
import logging
import pathlib
import sys

import jax
from flax import nnx

ROOT = pathlib.Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def tiny_config(workdir: pathlib.Path, mesh=(-1, 1, 1)):
    from relpos_jax.config import load_config

    corpus = workdir.parent / "corpus.txt"
    if not corpus.exists():
        corpus.write_text("".join(f"line {i}: value = {i * 7 % 13}\n" for i in range(3000)))
    config = load_config(ROOT / "configs" / "txl_small.py")
    config.model.update(n_layers=1, d_model=64, n_heads=8, d_ff=128, mem_len=8, dropout=0.0)
    config.data.update(
        name="text", path=str(corpus), dir=str(workdir.parent / "tfds"), segment_len=8, batch_size=8
    )
    config.train.update(steps=4, log_every=1, eval_every=0, ckpt_every=2, warmup_steps=0)
    config.mesh.update(data=mesh[0], fsdp=mesh[1], tensor=mesh[2])
    return config


class _CompileCounter(logging.Handler):
    """Counts XLA compilations per function (jax_log_compiles messages)."""

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if message.startswith("Compiling jit("):
            name = message[len("Compiling jit(") :].split(")")[0]
            COMPILES[name] = COMPILES.get(name, 0) + 1


COMPILES: dict[str, int] = {}


def count_compiles() -> None:
    jax.config.update("jax_log_compiles", True)
    logging.getLogger("jax._src.interpreters.pxla").addHandler(_CompileCounter())


def losses(workdir: pathlib.Path) -> list[float]:
    from relpos_jax.metrics import read_metrics

    return [m["train/loss"] for m in read_metrics(workdir) if "train/loss" in m]


def specs(trainer) -> dict[str, str]:
    """The sharding every parameter and optimizer moment really has, as PartitionSpec strings."""
    return {
        "/".join(str(getattr(k, "key", getattr(k, "idx", k))) for k in path): str(
            leaf.sharding.spec
        )
        for path, leaf in jax.tree_util.tree_flatten_with_path(trainer.state)[0]
    }


def _w_q(trainer):
    model, _ = nnx.merge(trainer.graphdef, trainer.state)
    return model.layer(0).attention.w_q[...]


def meshes(workdir: pathlib.Path) -> None:
    from relpos_jax.train import Trainer

    count_compiles()
    reference = Trainer(
        tiny_config(workdir / "one", (1, 1, 1)), workdir / "one", devices=jax.devices()[:1]
    )
    reference.run(stop_after=3)
    COMPILES.clear()
    result = {"devices": jax.device_count(), "one": losses(workdir / "one"), "meshes": {}}
    for mesh in [(2, 2, 2)]:  # every axis at once (data parallel alone: the loopback test)
        name = "x".join(map(str, mesh))
        trainer = Trainer(tiny_config(workdir / name, mesh), workdir / name)
        trainer.run(stop_after=3)  # before the last step: no final validation
        mems_spec = str(trainer.mems.states.sharding.spec)
        result["meshes"][name] = {
            "losses": losses(workdir / name),
            "specs": specs(trainer),
            "mems": mems_spec,
            "compiles": COMPILES.pop("train_step_fn", 0),
            "w_q_shard": list(_w_q(trainer).addressable_shards[0].data.shape),
        }
    print(json.dumps(result))


def train(workdir: pathlib.Path, stop: int, distributed: list[str]) -> None:
    if distributed:
        jax.config.update("jax_cpu_collectives_implementation", "gloo")
        jax.distributed.initialize(distributed[0], int(distributed[1]), int(distributed[2]))
    from relpos_jax.train import Trainer

    config = tiny_config(workdir)
    first = Trainer(config, workdir)
    first.run(stop_after=stop // 2)
    second = Trainer(config, workdir)  # restore what the first one saved
    summary = second.run()  # to the end: final validation over every valid token, across processes
    print(
        json.dumps(
            {
                "process": jax.process_index(),
                "devices": jax.device_count(),
                "resumed_from": second.resumed_from,
                "losses": losses(workdir),
                "valid_bpc": summary["valid_bpc"],
            }
        )
    )


if __name__ == "__main__":
    mode, directory = sys.argv[1], pathlib.Path(sys.argv[2])
    directory.mkdir(parents=True, exist_ok=True)
    if mode == "meshes":
        meshes(directory)
    else:
        train(directory, int(sys.argv[3]), sys.argv[4:])
