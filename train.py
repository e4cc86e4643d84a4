"""Train a language model: ``python train.py --config configs/txl_small.py [--config.x.y=v ...]``.

All logic lives in ``relpos_jax.train``; see the README for datasets, overrides and resuming.
"""

from __future__ import annotations

from absl import app

from relpos_jax import cli


def main(argv: list[str]) -> None:
    del argv
    from relpos_jax.checkpoint import latest_step
    from relpos_jax.train import Trainer

    workdir = cli.workdir()
    config = cli.config()
    step = latest_step(workdir / "checkpoints")
    if step is not None:
        print(
            f"resuming from step {step} in {workdir} (pass another --workdir to start fresh)",
            flush=True,
        )
    else:
        print(
            f"training {config.model.position} on {config.data.name} from scratch in {workdir}",
            flush=True,
        )
    try:
        trainer = Trainer(config, workdir)
    except cli.USER_ERRORS as error:
        cli.exit_with(str(error))
    summary = trainer.run()
    print(
        f"done: step {summary['step']}, valid bpc {summary['valid_bpc']:.4f} over {summary['valid_tokens']:,} "
        f"tokens, train bpc {summary['train_bpc']:.4f}, {summary['parameters']:,} parameters, "
        f"{summary['seconds'] / 60:.1f} min; evaluate: python eval.py --config "
        f"{cli.flags.FLAGS['config'].config_filename} --workdir {workdir}"
    )


if __name__ == "__main__":
    app.run(main, flags_parser=cli.parse_flags)
