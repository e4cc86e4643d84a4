"""Evaluate a trained run: ``python eval.py --config configs/txl_small.py [--workdir runs/txl_small]``.

Restores the latest checkpoint, reports perplexity and bits per token (bpc at the byte level) on
valid and test over every token exactly once with the ``eval.*`` settings (segment, memory,
clamp_len, same_length), writes ``eval.json`` in the work directory (each split's per-window bits
and tokens, for bootstrap intervals, in ``eval_windows.npz`` beside it); ``--sample N`` prints N
generated tokens (bytes, or words of a word-level corpus) after ``--prompt``. An evaluation that
was killed leaves ``eval.running`` behind, and the next one says in its first line where it goes
on from: each split from the scores its pass kept (``eval_<split>.progress.npz``, at most a minute
old; one process), or from the first token.
"""

from __future__ import annotations

import time

from absl import app, flags

from relpos_jax import cli
from relpos_jax.ops import host_memory

_SAMPLE = flags.DEFINE_integer("sample", 0, "Generate this many tokens after --prompt.")
_PROMPT = flags.DEFINE_string("prompt", "def ", "Prompt for --sample.")
_SPLITS = flags.DEFINE_list("splits", ["valid", "test"], "Splits to evaluate.")


def main(argv: list[str]) -> None:
    del argv
    host_memory.reuse_freed_memory()  # before JAX's first computation
    cli.split_cpu_into_cores(cli.config())  # before JAX starts
    cli.initialize_distributed()
    import jax

    from relpos_jax.config import Config
    from relpos_jax.errors import accelerator_error
    from relpos_jax.eval_results import going_on, save_results, split_progress
    from relpos_jax.evaluate import restore_model, run_eval

    workdir = cli.workdir()
    running = workdir / "eval.running"  # there while an evaluation runs: a killed one leaves it
    killed = running.read_text().strip() if running.exists() else None
    try:
        model, config, step = restore_model(cli.config(), workdir)
        progress = {}
        if jax.process_count() == 1:  # each split's pass kept as it goes, until eval.json is saved
            progress = {s: split_progress(workdir, config, s, step) for s in _SPLITS.value}
        if killed:
            cli.say(going_on(killed, progress))
        if jax.process_index() == 0:
            running.write_text(f"{time.strftime('%Y-%m-%d %H:%M:%S')}, splits {_SPLITS.value}\n")
        results = run_eval(model, config, _SPLITS.value, progress)
    except cli.USER_ERRORS as error:
        cli.exit_with(str(error))
    except jax.errors.JaxRuntimeError as error:
        explained = accelerator_error(error, Config.from_any(cli.config()))
        if explained is None:
            raise
        cli.exit_with_device_failure(explained, workdir)
    results["step"] = step
    results["data"] = {
        "name": config.data.name, "partition": config.data.partition,
        "python": config.data.corpus_python,
    }  # fmt: skip
    if jax.process_index() == 0:
        save_results(workdir, results)
        running.unlink(missing_ok=True)
        for kept in progress.values():
            kept.done()
    for split in _SPLITS.value:
        r = results[split]
        cli.say(
            f"{split}: ppl {r['ppl']:.3f}  bits/token {r['bits_per_token']:.4f}  ({r['tokens']:,} "
            f"tokens, segment {results['settings']['segment_len']}, memory "
            f"{results['settings']['mem_len']})"
        )
    if _SAMPLE.value:
        from relpos_jax import generate
        from relpos_jax.data import Vocabulary, open_data, tokenizer
        from relpos_jax.data.words import read_vocabulary

        if config.data.vocab:  # a converted model's own vocabulary: no corpus needed
            words = Vocabulary(read_vocabulary(config.data.vocab))
        else:
            words = open_data(config.data, "train").vocabulary  # None: bytes
        vocabulary = words or tokenizer
        prompt = vocabulary.encode(_PROMPT.value)[None]
        tokens = generate(model, prompt, _SAMPLE.value, temperature=0.8, top_k=40)
        cli.say(_PROMPT.value + (" " if words else "") + vocabulary.decode(tokens[0]))


if __name__ == "__main__":
    app.run(main, flags_parser=cli.parse_flags)
