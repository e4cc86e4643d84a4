"""Train a language model: ``python train.py --config configs/txl_small.py [--config.x.y=v ...]``.

All logic lives in ``relpos_jax.train``; see the README for datasets, overrides and resuming, and
docs/scaling.md for GPUs, TPU pods and several processes.
"""

from __future__ import annotations

import sys

from absl import app

from relpos_jax import cli
from relpos_jax.ops import host_memory


def main(argv: list[str]) -> None:
    del argv
    host_memory.reuse_freed_memory()  # before JAX's first computation
    cli.split_cpu_into_cores(cli.config())  # before JAX starts
    cli.initialize_distributed()
    from relpos_jax.checkpoint import latest_step
    from relpos_jax.errors import AcceleratorError
    from relpos_jax.train import NonFiniteLoss, Trainer

    workdir, config = cli.workdir(), cli.config()
    step = latest_step(workdir / "checkpoints")
    if step is not None:
        cli.say(f"resuming from step {step} in {workdir} (pass another --workdir to start fresh)")
    else:
        cli.say(f"training {config.model.position} on {config.data.name} from scratch in {workdir}")
    try:
        trainer = Trainer(config, workdir)
        s = trainer.run()
    except cli.USER_ERRORS as error:
        cli.exit_with(str(error))
    except AcceleratorError as error:
        cli.exit_with_device_failure(error, workdir)
    except NonFiniteLoss as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(1)
    if s is None:
        cli.say(
            f"received {trainer.stopped_by}: saved a checkpoint at step {trainer.step} in {workdir}; "
            "run the same command to resume"
        )
        return
    train_bpc = "n/a" if s["train_bpc"] is None else f"{s['train_bpc']:.4f}"
    cli.say(
        f"done: step {s['step']}, valid bpc {s['valid_bpc']:.4f} over {s['valid_tokens']:,} tokens, "
        f"train bpc {train_bpc}, {s['parameters']:,} parameters, {s['seconds'] / 60:.1f} min; "
        f"evaluate: python eval.py --config {cli.config_path()} --workdir {workdir}"
    )


if __name__ == "__main__":
    app.run(main, flags_parser=cli.parse_flags)
