"""Equal steps, sizes, data and schedule: relpos_jax against x-transformers, with memory and
without, over seeds.

    python -m experiments.compare_training [--schemes alibi,t5,rope] [--mem-len 64] [--seeds 0,1]
        [--steps 600] [--set model.n_layers=4 ...] [--dry-run] [--finished-only]

For each scheme, memory (``--mem-len`` and 0) and seed, two runs:

* relpos_jax: one ``train.py`` and one ``eval.py`` command line (``configs/<scheme>_small.py``,
  ``txl_small.py`` for txl, then ``--set``), as every sweep (``experiments.sweep``);
* x-transformers (CPU PyTorch, the ``bench`` extra): ``python -m experiments.compare_training --peer
  SCHEME:MEMORY:SEED`` with the same flags, built from the same config: its ALiBi
  (``alibi_pos_bias``), T5 bias (``rel_pos_bias``) or rotary embeddings (on half of each head's
  dimensions, its default, where ours turn all of them), a ReLU feed-forward layer (as ours; its
  default is GELU), pre- or post-norm as ``model.pre_norm``, its output layer tied as
  ``model.tie_embeddings``, XL memory of the same length (``max_mem_len``: the layers' input
  states, normalised as the layer normalises its input, no gradient), initialised its own way
  (PyTorch's defaults, token embeddings kaiming-normal, none scaled by √d; ours:
  ``model.init_std``, embeddings scaled by √d); trained with the same Adam, warm-up and cosine
  schedule, clipping, seed and batches, and evaluated as ``eval.py`` evaluates (every test token
  once, rows of contiguous text, memory carried). Its result is a JSON in the run folder, reused
  when it is there.

Writes ``compare_training.json`` (settings, every run's test bpc) in ``--out`` and renders
``compare_training.md`` from it: test bpc (mean ± sd over seeds) of each library, scheme and memory,
and memory's effect (memory − none) in each library, marked where it exceeds twice the spread.
"""

from __future__ import annotations

import json
import math
import pathlib
import shlex
import sys
import time

from bench import args as options
from bench.measure import ROOT
from experiments import compare, sweep
from experiments.common import (
    X_TRANSFORMERS_SAME,
    config_file,
    overrides,
    run_name,
    x_transformers_options,
)


def _config(scheme: str, mem_len: int, seed: int, sets, steps: int):
    from relpos_jax.config import Config, load_config

    settings = [f"train.steps={steps}", *overrides(mem_len, seed, sets)]
    return Config.from_any(load_config(ROOT / config_file(scheme), settings))


def run_peer(scheme: str, mem_len: int, seed: int, sets, steps: int) -> dict:
    """Train and evaluate x-transformers as the module docstring says: ``{"test_bpc", "minutes"}``."""
    import numpy as np
    import torch
    from x_transformers import Decoder, TransformerWrapper

    from relpos_jax import data

    cfg = _config(scheme, mem_len, seed, sets, steps)
    m, d, t = cfg.model, cfg.data, cfg.train
    torch.manual_seed(seed)
    position = x_transformers_options(scheme, t5=m.t5)
    model = TransformerWrapper(
        num_tokens=m.vocab_size, max_seq_len=d.segment_len, max_mem_len=mem_len,
        tie_embedding=m.tie_embeddings, use_abs_pos_emb=False,
        attn_layers=Decoder(
            dim=m.d_model, depth=m.n_layers, heads=m.n_heads, attn_dim_head=m.head_dim,
            ff_mult=m.d_ff // m.d_model, ff_custom_activation=torch.nn.ReLU(),
            pre_norm=m.pre_norm, attn_dropout=m.dropatt, ff_dropout=m.dropout, **position,
        ),
    )  # fmt: skip
    optimizer = torch.optim.Adam(model.parameters(), lr=t.lr, betas=(t.b1, t.b2))

    def lr_at(step: int) -> float:  # optax.warmup_cosine_decay_schedule, end value 0
        if step < t.warmup_steps:
            return t.lr * step / t.warmup_steps
        progress = min(1.0, (step - t.warmup_steps) / max(1, steps - t.warmup_steps))
        return t.lr * 0.5 * (1 + math.cos(math.pi * progress))

    def scored(batch, mems):
        inputs = torch.from_numpy(np.asarray(batch["inputs"])).long()
        logits, mems = model(inputs, mems=mems if mem_len else None, return_mems=True)
        losses = torch.nn.functional.cross_entropy(
            logits.reshape(-1, m.vocab_size),
            torch.from_numpy(np.asarray(batch["targets"])).long().reshape(-1), reduction="none",
        )  # fmt: skip
        return losses, [x.detach() for x in mems]

    dataset = data.train_dataset(data.open_data(d, "train"), d.batch_size, d.segment_len)
    mems, start = None, time.perf_counter()
    model.train()
    for step in range(steps):
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        losses, mems = scored(dataset[step], mems)
        optimizer.zero_grad(set_to_none=True)
        losses.mean().backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.clip)
        optimizer.step()
    minutes = (time.perf_counter() - start) / 60
    model.eval()
    total, count, mems = 0.0, 0.0, None
    with torch.no_grad():
        for batch in data.eval_batches(data.open_data(d, "test"), cfg.eval.batch_size,
                                       d.segment_len):  # fmt: skip
            losses, mems = scored(batch, mems)
            weights = torch.from_numpy(np.asarray(batch["weights"])).reshape(-1)
            total += float((losses * weights).sum())
            count += float(weights.sum())
    return {"test_bpc": total / count / math.log(2), "minutes": minutes, "step": steps}


def _peer_file(runs: pathlib.Path, scheme: str, mem_len: int, seed: int) -> pathlib.Path:
    return runs / f"x-transformers_{scheme}_mem{mem_len}_seed{seed}" / "result.json"


def _peer_command(args, key: str) -> str:
    flags = ["--steps", str(args.steps), "--runs", str(args.runs), "--peer", key]
    sets = [f"--set={s}" for s in args.set]
    return shlex.join(["python", "-m", "experiments.compare_training", *flags, *sets])


def render(results: dict) -> str:
    s = results["settings"]
    groups: dict[tuple[str, str, int], list[float]] = {}
    for run in results["runs"]:
        key = (run["scheme"], run["library"], run["memory"])
        groups.setdefault(key, []).append(run["test_bpc"])
    lines = [
        "# relpos_jax against x-transformers: memory at equal steps",
        "",
        f"Command: `{s['command']}`  ",
        f"Machine: {s['machine']}; commit {s['commit']}; {s['date']}.",
        "",
        f"{s['steps']} steps, seeds {', '.join(map(str, s['seeds']))}, overrides: "
        f"{', '.join(f'`{x}`' for x in s['sets']) or 'none'}. Test bpc over every token of the "
        "split, mean ± sd over the seeds; *memory effect*: memory − none (negative: memory helps), "
        "* where it exceeds twice the spread.",
        "",
        "| scheme | library | memory | test bpc | memory effect |",
        "|---|---|---:|---:|---:|",
    ]
    for scheme in s["schemes"]:
        for library in ("relpos_jax", "x-transformers"):
            with_memory = groups.get((scheme, library, s["mem_len"]), [])
            without = groups.get((scheme, library, 0), [])
            for memory, values in ((s["mem_len"], with_memory), (0, without)):
                effect = ""
                if memory and with_memory and without:
                    delta = compare.mean_sd(with_memory)[0] - compare.mean_sd(without)[0]
                    effect = f"{delta:+.4f}{' *' if compare.apart(with_memory, without) else ''}"
                lines.append(
                    f"| {scheme} | {library} | {memory} | {compare.mean_sd_text(values, 4)} | "
                    f"{effect} |"
                )
    return "\n".join([*lines, *sweep.missing_lines(s)]) + "\n"


def main() -> None:
    parser = options.parser(__doc__)
    parser.add_argument("--steps", type=int, default=600)
    options.add_schemes(parser, X_TRANSFORMERS_SAME)
    parser.add_argument("--seeds", type=options.ints, default="0,1", help="train.seed values")
    parser.add_argument("--mem-len", type=int, default=64, help="the memory runs' mem_len")
    parser.add_argument("--peer", help="SCHEME:MEMORY:SEED: run that x-transformers run only")
    sweep.add_options(parser)
    options.add_runs(parser, "runs/compare_training")
    options.add_out(parser, "docs/results")
    options.add_overrides(parser)
    args = parser.parse_args()
    runs_dir = pathlib.Path(args.runs)
    if args.peer:
        scheme, mem_len, seed = args.peer.split(":")
        result = run_peer(scheme, int(mem_len), int(seed), args.set, args.steps)
        sweep.write(_peer_file(runs_dir, scheme, int(mem_len), int(seed)), result)
        return
    keys = [(s, m, seed) for s in args.schemes for m in (args.mem_len, 0) for seed in args.seeds]
    ours = {
        key: sweep.Run(
            name=run_name(*key), workdir=runs_dir / run_name(*key), config=config_file(key[0]),
            settings=(f"train.steps={args.steps}", *overrides(key[1], key[2], args.set)),
        )
        for key in keys
    }  # fmt: skip
    if args.dry_run:
        sweep.list_pending((ours.values(), args.steps))
        print("\n".join(_peer_command(args, ":".join(map(str, key))) for key in keys))
        return
    finished = sweep.finish(ours, args)
    _, evaluated, missing = finished
    rows = [
        {"scheme": s, "library": "relpos_jax", "memory": m, "seed": seed,
         "test_bpc": evaluated[run.name]["test"]["bpc"]}
        for (s, m, seed), run in ours.items() if run.name in evaluated
    ]  # fmt: skip
    for scheme, mem_len, seed in keys:
        path = _peer_file(runs_dir, scheme, mem_len, seed)
        name = f"x-transformers {scheme}_mem{mem_len}_seed{seed}"
        if not path.exists() and not args.finished_only:
            print(f"{name}: running", file=sys.stderr, flush=True)
            result = run_peer(scheme, mem_len, seed, args.set, args.steps)
            sweep.write(path, result)
        if not path.exists() or json.loads(path.read_text()).get("step") != args.steps:
            missing.append(name)
            continue
        rows.append({"scheme": scheme, "library": "x-transformers", "memory": mem_len,
                     "seed": seed, "test_bpc": json.loads(path.read_text())["test_bpc"]})  # fmt: skip
    results = {
        "settings": sweep.settings(
            ["experiments.compare_training", *sys.argv[1:]], steps=args.steps, mem_len=args.mem_len,
            seeds=list(args.seeds), schemes=list(args.schemes), sets=list(args.set),
            missing=missing,
        ),
        "runs": rows,
    }  # fmt: skip
    out = pathlib.Path(args.out)
    sweep.write(out / "compare_training.json", results)
    (out / "compare_training.md").write_text(render(results))
    print(render(results))


if __name__ == "__main__":
    main()
