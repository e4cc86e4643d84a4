"""Equal steps, equal sizes, same data: Transformer-XL with memory vs without, and vs x-transformers.

    .venv/bin/python -m bench.compare_training [--steps 500] [--skip-ours]

Runs, one after the other on the embedded pystdlib corpus with txl_small's sizes and hyperparameters
(6 layers, d_model 256, 4x64 heads, d_ff 1024, segment 128, batch 16, Adam 1e-3, 50 warm-up steps,
cosine, clip 0.25, no dropout):

1. relpos_jax txl_small, memory 128  (``train.py`` then ``eval.py``)
2. relpos_jax txl_small, memory 0
3. x-transformers (PyTorch CPU), XL memory 128 (``max_mem_len``) with its T5 relative bias, trained
   with the same optimizer, schedule, clipping and batches, evaluated with the same protocol (every
   test token once, rows of contiguous text, segment 128, memory carried); once with tied
   embeddings (as ours) and once with its default untied output layer.

Prints a markdown table of test bpc. Needs the ``bench`` extra for step 3.
"""

from __future__ import annotations

import json
import math
import pathlib
import subprocess
import sys
import time

from bench import args as options
from bench.measure import ROOT


def run_ours(workdir: pathlib.Path, steps: int, mem_len: int) -> dict:
    done = workdir / "eval.json"
    if (
        done.exists() and json.loads(done.read_text()).get("step") == steps
    ):  # finished before: reuse
        return {"test_bpc": json.loads(done.read_text())["test"]["bpc"], "minutes": float("nan")}
    overrides = [f"--config.train.steps={steps}", f"--config.model.mem_len={mem_len}"]
    common = ["--config", "configs/txl_small.py", "--workdir", str(workdir), *overrides]
    start = time.perf_counter()
    subprocess.run([sys.executable, "train.py", *common], cwd=ROOT, check=True)
    minutes = (time.perf_counter() - start) / 60
    subprocess.run([sys.executable, "eval.py", *common, "--splits", "test"], cwd=ROOT, check=True)
    result = json.loads((workdir / "eval.json").read_text())
    return {"test_bpc": result["test"]["bpc"], "minutes": minutes}


def run_x_transformers(steps: int, tie_embedding: bool) -> dict:
    import numpy as np
    import torch
    from x_transformers import Decoder, TransformerWrapper

    from relpos_jax import data
    from relpos_jax.config import Config, load_config

    cfg = Config.from_any(load_config(ROOT / "configs" / "txl_small.py"))
    m, d, t = cfg.model, cfg.data, cfg.train
    torch.manual_seed(t.seed)
    model = TransformerWrapper(
        num_tokens=m.vocab_size,
        max_seq_len=d.segment_len,
        max_mem_len=m.mem_len,
        tie_embedding=tie_embedding,
        use_abs_pos_emb=False,
        attn_layers=Decoder(
            dim=m.d_model,
            depth=m.n_layers,
            heads=m.n_heads,
            attn_dim_head=m.head_dim,
            ff_mult=m.d_ff // m.d_model,
            rel_pos_bias=True,
        ),
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=t.lr, betas=(t.b1, t.b2))

    def lr_at(step: int) -> float:  # optax.warmup_cosine_decay_schedule, end value 0
        if step < t.warmup_steps:
            return t.lr * step / t.warmup_steps
        progress = min(1.0, (step - t.warmup_steps) / max(1, steps - t.warmup_steps))
        return t.lr * 0.5 * (1 + math.cos(math.pi * progress))

    train = data.open_data(d, "train")
    dataset = data.train_dataset(train, d.batch_size, d.segment_len)
    mems, start = None, time.perf_counter()
    model.train()
    for step in range(steps):
        batch = dataset[step]
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        logits, mems = model(torch.from_numpy(batch["inputs"]).long(), mems=mems, return_mems=True)
        loss = torch.nn.functional.cross_entropy(
            logits.reshape(-1, m.vocab_size), torch.from_numpy(batch["targets"]).long().reshape(-1)
        )
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), t.clip)
        optimizer.step()
        mems = [x.detach() for x in mems]
        if (step + 1) % 50 == 0:
            print(
                f"x-transformers step {step + 1}: train bpc {loss.item() / math.log(2):.4f}",
                flush=True,
            )
    minutes = (time.perf_counter() - start) / 60
    model.eval()
    test = data.open_data(d, "test")
    total, count, mems = 0.0, 0.0, None
    with torch.no_grad():
        for batch in data.eval_batches(test, cfg.eval.batch_size, d.segment_len):
            logits, mems = model(
                torch.from_numpy(batch["inputs"]).long(), mems=mems, return_mems=True
            )
            losses = torch.nn.functional.cross_entropy(
                logits.reshape(-1, m.vocab_size),
                torch.from_numpy(batch["targets"]).long().reshape(-1),
                reduction="none",
            )
            weights = torch.from_numpy(np.asarray(batch["weights"])).reshape(-1)
            total += float((losses * weights).sum())
            count += float(weights.sum())
    return {"test_bpc": total / count / math.log(2), "minutes": minutes}


def main() -> None:
    parser = options.parser(__doc__)
    parser.add_argument("--steps", type=int, default=500)
    options.add_runs(parser, "runs/compare_training")
    parser.add_argument("--skip-ours", action="store_true", help="only the x-transformers runs")
    parser.add_argument(
        "--peers",
        nargs="+",
        default=["tied", "untied"],
        choices=["tied", "untied"],
        help="x-transformers with tied embeddings (as ours) and/or its default (untied)",
    )
    args = parser.parse_args()
    runs = pathlib.Path(args.runs)
    rows = []
    if not args.skip_ours:
        rows.append(("relpos_jax txl, memory 128", run_ours(runs / "txl_mem128", args.steps, 128)))
        rows.append(("relpos_jax txl, memory 0", run_ours(runs / "txl_mem0", args.steps, 0)))
    for peer in args.peers:
        result = run_x_transformers(args.steps, tie_embedding=peer == "tied")
        rows.append((f"x-transformers T5 bias, XL memory 128, {peer} embeddings", result))
    print(f"\n{args.steps} steps each, txl_small sizes and hyperparameters, pystdlib\n")
    print("| model | test bpc | train minutes |\n|---|---:|---:|")
    for name, result in rows:
        print(f"| {name} | {result['test_bpc']:.4f} | {result['minutes']:.1f} |")


if __name__ == "__main__":
    main()
