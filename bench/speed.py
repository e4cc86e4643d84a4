"""Speed side by side: relpos_jax against x-transformers (CPU PyTorch) at the same sizes, in one run.

    .venv/bin/python bench/speed.py [--repeats 5] [--warmup 2] [--schemes txl,t5,rope,alibi,sinusoid]
        [--dtypes float32,bfloat16] [--tasks train,eval] [--size small|base]
    .venv/bin/python bench/speed.py --payoff [--contexts 256,512,1024,2048]
    .venv/bin/python bench/speed.py --scaling [--lengths 128,256,512,1024,2048]
    python bench/speed.py --mfu --size base,large --dtypes bfloat16   # on an accelerator: gpu.sh

Needs the ``bench`` extra (``pip install -e .[bench]``: CPU PyTorch and x-transformers).

Default mode: for each scheme and dtype, training tokens/s (forward, backward, Adam, memory carried)
and evaluation tokens/s (forward with memory, no gradient) of relpos_jax and of its x-transformers
counterpart — Transformer-XL (ours) and T5 (ours) against x-transformers' T5 relative bias, rope
against rotary, alibi against ALiBi, sinusoid against absolute — at txl_small's sizes (6 layers,
d_model 256, 4×64 heads, d_ff 1024, segment 128, memory 128, batch 16, dropout 0.1 in training).
Each measurement runs in its own subprocess, the two libraries alternating, so that peak resident
memory is the measurement's own; tokens/s is the median of ``--repeats`` timed calls after
``--warmup``. bfloat16 is relpos_jax's ``model.dtype = "bfloat16"`` (bf16 products with float32
accumulation, float32 master weights) against ``torch.autocast("cpu", torch.bfloat16)``.

``--payoff`` (the Transformer-XL paper's Table 9): evaluation tokens/s with memory (segments and
memory both as long as the context; best of two passes) against a vanilla model that recomputes its whole context for every token (sliding
window, stride 1), at each context length; the same relpos_jax model and weights for both.

``--scaling``: training-step time and XLA's temporary memory for one batch row as the segment (=
memory) grows, for every scheme (relpos_jax only).

``--mfu``: relpos_jax training tokens/s and model FLOPs utilisation (``model_flops`` per token ×
tokens/s over the device's dense peak, ``PEAK_TFLOPS``) for each ``--size``.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

SIZES = {
    "small": dict(layers=6, d_model=256, heads=4, d_ff=1024, seg=128, mem=128, batch=16),
    "base": dict(layers=12, d_model=512, heads=8, d_ff=2048, seg=512, mem=512, batch=22),  # enwik8
    "large": dict(layers=24, d_model=1024, heads=16, d_ff=4096, seg=512, mem=512, batch=16),
    "tiny": dict(layers=1, d_model=32, heads=2, d_ff=64, seg=16, mem=16, batch=2),  # smoke tests
}
VOCAB = 256
PEERS = {
    "txl": "rel_pos_bias",
    "t5": "rel_pos_bias",
    "rope": "rotary_pos_emb",
    "alibi": "alibi_pos_bias",
    "sinusoid": "absolute",
}
PEAK_TFLOPS = {  # dense bf16 / fp32 (non-tensor-core) peaks from the vendors' data sheets
    "H200": {"bfloat16": 989.0, "float32": 67.0},
    "H100": {"bfloat16": 989.0, "float32": 67.0},
    "A100": {"bfloat16": 312.0, "float32": 19.5},
    "TPU v5 lite": {"bfloat16": 197.0, "float32": 197.0},
    "TPU v4": {"bfloat16": 275.0, "float32": 275.0},
}
ALL_SCHEMES = ("txl", "shaw", "t5", "deberta", "alibi", "rope", "sinusoid", "learned", "none")


def median_seconds(call, repeats: int, warmup: int) -> float:
    for _ in range(warmup):
        call()
    durations = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        durations.append(time.perf_counter() - start)
    return statistics.median(durations)


def ours(task: str, scheme: str, dtype: str, size: dict, repeats: int, warmup: int) -> float:
    """Tokens/s of relpos_jax for ``task`` in {train, eval}."""
    import jax
    import optax
    from flax import nnx

    from relpos_jax import TransformerLM

    model = TransformerLM(
        dict(
            position=scheme, n_layers=size["layers"], d_model=size["d_model"],
            n_heads=size["heads"], d_ff=size["d_ff"], mem_len=size["mem"],
            dropout=0.1 if task == "train" else 0.0, dtype=dtype,
        ),
        rngs=nnx.Rngs(0),
    )  # fmt: skip
    batch, seg = size["batch"], size["seg"]
    data = jax.random.randint(jax.random.key(0), (batch, seg + 1), 0, VOCAB)
    inputs, targets = data[:, :-1], data[:, 1:]
    graphdef, state = nnx.split(model)
    carry = {"mems": model.init_mems(batch)}
    if task == "eval":

        @jax.jit
        def forward(state, mems):
            logits, mems = nnx.merge(graphdef, state)(inputs, mems)
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, targets).sum()
            return loss, mems

        def call():
            loss, carry["mems"] = forward(state, carry["mems"])
            jax.block_until_ready(loss)

        return batch * seg / median_seconds(call, repeats, warmup)

    optimizer = nnx.Optimizer(model, optax.adam(2.5e-4), wrt=nnx.Param)
    graphdef, state = nnx.split((model, optimizer))

    def train_step(state, mems):
        model, optimizer = nnx.merge(graphdef, state)

        def loss_fn(model):
            logits, new_mems = model(inputs, mems, deterministic=False)
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()
            return loss, new_mems

        (loss, new_mems), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
        optimizer.update(model, grads)
        return loss, nnx.state((model, optimizer)), new_mems

    train_step = jax.jit(train_step, donate_argnums=(0, 1))
    carry["state"] = state

    def call():
        loss, carry["state"], carry["mems"] = train_step(carry["state"], carry["mems"])
        jax.block_until_ready(loss)

    return batch * seg / median_seconds(call, repeats, warmup)


def peer(task: str, scheme: str, dtype: str, size: dict, repeats: int, warmup: int) -> float:
    """Tokens/s of x-transformers for ``task``, its closest option to ``scheme``."""
    import contextlib

    import torch
    from x_transformers import Decoder, TransformerWrapper

    torch.manual_seed(0)
    option = PEERS[scheme]
    dropout = 0.1 if task == "train" else 0.0
    layers = Decoder(
        dim=size["d_model"], depth=size["layers"], heads=size["heads"],
        attn_dim_head=size["d_model"] // size["heads"], ff_mult=size["d_ff"] // size["d_model"],
        ff_dropout=dropout, **({} if option == "absolute" else {option: True}),
    )  # fmt: skip
    model = TransformerWrapper(
        num_tokens=VOCAB, max_seq_len=size["seg"], max_mem_len=size["mem"], attn_layers=layers,
        emb_dropout=dropout, tie_embedding=True, use_abs_pos_emb=option == "absolute",
    )  # fmt: skip
    batch, seg = size["batch"], size["seg"]
    data = torch.randint(0, VOCAB, (batch, seg + 1))
    inputs, targets = data[:, :-1], data[:, 1:].reshape(-1)
    autocast = (
        torch.autocast("cpu", dtype=torch.bfloat16)
        if dtype == "bfloat16"
        else contextlib.nullcontext()
    )
    carry = {"mems": None}
    if task == "eval":
        model.eval()

        def call():
            with torch.no_grad(), autocast:
                logits, mems = model(inputs, mems=carry["mems"], return_mems=True)
                torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB).float(), targets)
            carry["mems"] = mems

        return batch * seg / median_seconds(call, repeats, warmup)

    model.train()
    optimizer = torch.optim.Adam(model.parameters(), lr=2.5e-4)

    def call():
        with autocast:
            logits, mems = model(inputs, mems=carry["mems"], return_mems=True)
            loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB).float(), targets)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        carry["mems"] = [m.detach() for m in mems]

    return batch * seg / median_seconds(call, repeats, warmup)


def payoff(context: int, repeats: int, size: dict) -> dict:
    """Evaluation tokens/s with memory and with stride-1 recomputation, same model, context C."""
    import numpy as np
    from flax import nnx

    from relpos_jax import TransformerLM
    from relpos_jax.data import ArrayStream
    from relpos_jax.evaluate import evaluate, evaluate_sliding

    model = TransformerLM(
        dict(
            position="txl", n_layers=size["layers"], d_model=size["d_model"],
            n_heads=size["heads"], d_ff=size["d_ff"], mem_len=context,
        ),
        rngs=nnx.Rngs(0),
    )  # fmt: skip
    batch, seg = size["batch"], context  # segments as long as the memory, as in the paper's eval
    tokens = np.random.default_rng(0).integers(0, VOCAB, 1 << 20).astype(np.int32)
    stream = ArrayStream(tokens)
    xl_tokens = batch * seg * 4  # four segments: the memory is full from the second on
    evaluate(model, stream, batch_size=batch, segment_len=seg, mem_len=context, max_tokens=4096)
    xl = max(
        evaluate(
            model, stream, batch_size=batch, segment_len=seg, mem_len=context, max_tokens=xl_tokens
        )["tokens_per_sec"]
        for _ in range(repeats)
    )
    # vanilla: every token recomputes its window; a batch of windows a call, a few calls
    window_tokens = context + batch * 4
    evaluate_sliding(model, stream, batch_size=batch, window=context, stride=1, max_tokens=context)
    vanilla = max(
        evaluate_sliding(
            model, stream, batch_size=batch, window=context, stride=1, max_tokens=window_tokens
        )["tokens_per_sec"]
        for _ in range(repeats)
    )
    return {"context": context, "memory_tok_s": xl, "vanilla_tok_s": vanilla}


def scaling(scheme: str, length: int, repeats: int, size: dict) -> dict:
    """Train-step seconds and XLA temporary MiB at segment = memory = ``length``, batch 1."""
    import jax
    import optax
    from flax import nnx

    from relpos_jax import TransformerLM

    model = TransformerLM(
        dict(
            position=scheme, n_layers=size["layers"], d_model=size["d_model"],
            n_heads=size["heads"], d_ff=size["d_ff"], mem_len=length, max_len=2 * length,
        ),
        rngs=nnx.Rngs(0),
    )  # fmt: skip
    data = jax.random.randint(jax.random.key(0), (1, length + 1), 0, VOCAB)
    graphdef, params, rest = nnx.split(model, nnx.Param, ...)
    mems = model.init_mems(1)

    def loss(params, rest, mems):
        logits, _ = nnx.merge(graphdef, params, rest)(data[:, :-1], mems)
        return optax.softmax_cross_entropy_with_integer_labels(logits, data[:, 1:]).mean()

    compiled = jax.jit(jax.grad(loss)).lower(params, rest, mems).compile()
    temp = compiled.memory_analysis().temp_size_in_bytes / 2**20
    seconds = median_seconds(
        lambda: jax.block_until_ready(compiled(params, rest, mems)), repeats, 1
    )
    return {"seconds": seconds, "temp_mib": temp}


def model_flops(size: dict, scheme: str = "txl") -> float:
    """Training FLOPs per token: 3 × the forward matrix products (backward = 2 × forward).

    Per layer and segment token, forward: queries and output 2·2·D², keys and values over the whole
    window 2·2·D²·K/T (memory rows included), feed-forward 2·2·D·F, attention scores and values
    2·2·K·D, and for Transformer-XL the position scores 2·K·D; plus the output layer 2·D·V.
    """
    d, f, t = size["d_model"], size["d_ff"], size["seg"]
    k = t + size["mem"]
    layer = 4 * d * d + 4 * d * d * k / t + 4 * d * f + 4 * k * d
    if scheme == "txl":
        layer += 2 * k * d
    return 3 * (size["layers"] * layer + 2 * d * VOCAB)


def mfu(size_name: str, dtype: str, repeats: int, warmup: int) -> dict:
    import jax

    size = SIZES[size_name]
    tokens_per_sec = ours("train", "txl", dtype, size, repeats, warmup)
    achieved = tokens_per_sec * model_flops(size) / 1e12
    device = jax.devices()[0].device_kind
    peak = next((p[dtype] for name, p in PEAK_TFLOPS.items() if name in device), None)
    return {
        "device": device,
        "tokens_per_sec": tokens_per_sec,
        "tflops": achieved,
        "mfu": achieved / peak if peak else None,
    }


def worker(spec: dict) -> None:
    if spec["mode"] == "mfu":
        result = mfu(spec["size"], spec["dtype"], spec["repeats"], spec["warmup"])
    elif spec["mode"] == "payoff":
        result = payoff(spec["context"], spec["repeats"], SIZES[spec["size"]])
    elif spec["mode"] == "scaling":
        result = scaling(spec["scheme"], spec["length"], spec["repeats"], SIZES[spec["size"]])
    else:
        run = ours if spec["library"] == "relpos_jax" else peer
        size = SIZES[spec["size"]]
        tokens_per_sec = run(
            spec["task"], spec["scheme"], spec["dtype"], size, spec["repeats"], spec["warmup"]
        )
        result = {"tokens_per_sec": tokens_per_sec}
    result["peak_mib"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps(result))


def measure(spec: dict) -> dict:
    command = [sys.executable, __file__, "--worker", json.dumps(spec)]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode:
        errors = [line for line in result.stderr.splitlines() if "Error" in line] or ["failed"]
        return {"error": errors[-1][:120]}
    return json.loads(result.stdout.strip().splitlines()[-1])


def cell(result: dict, key: str, fmt: str = ",.0f") -> str:
    return f"error: {result['error']}" if "error" in result else format(result[key], fmt)


def side_by_side(args) -> None:
    size = SIZES[args.size]
    print(
        f"{size['layers']} layers, d_model {size['d_model']}, {size['heads']} heads, d_ff "
        f"{size['d_ff']}, segment {size['seg']}, memory {size['mem']}, batch {size['batch']}; "
        f"tokens/s, median of {args.repeats} after {args.warmup}\n"
    )
    print("| task | dtype | scheme | relpos_jax tok/s | peak MiB | x-transformers | tok/s | "
          "peak MiB | ours / peer |")  # fmt: skip
    print("|---|---|---|---:|---:|---|---:|---:|---:|")
    for task in args.tasks.split(","):
        for dtype in args.dtypes.split(","):
            for scheme in args.schemes.split(","):
                spec = dict(
                    mode="speed", task=task, scheme=scheme, dtype=dtype, size=args.size,
                    repeats=args.repeats, warmup=args.warmup,
                )  # fmt: skip
                mine = measure({**spec, "library": "relpos_jax"})
                theirs = measure({**spec, "library": "x-transformers"}) if scheme in PEERS else {}
                ratio = (
                    f"{mine['tokens_per_sec'] / theirs['tokens_per_sec']:.2f}x"
                    if "tokens_per_sec" in mine and "tokens_per_sec" in theirs
                    else ""
                )
                peer_cells = (
                    f"{PEERS[scheme]} | {cell(theirs, 'tokens_per_sec')} | "
                    f"{cell(theirs, 'peak_mib')}"
                    if theirs
                    else "— | | "
                )
                print(
                    f"| {task} | {dtype} | {scheme} | {cell(mine, 'tokens_per_sec')} | "
                    f"{cell(mine, 'peak_mib')} | {peer_cells} | {ratio} |",
                    flush=True,
                )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--schemes", default=",".join(PEERS))
    parser.add_argument("--dtypes", default="float32,bfloat16")
    parser.add_argument("--tasks", default="train,eval")
    parser.add_argument("--size", default="small", help=f"one of {sorted(SIZES)}; --mfu: a list")
    parser.add_argument("--mfu", action="store_true")
    parser.add_argument("--payoff", action="store_true")
    parser.add_argument("--contexts", default="256,512,1024,2048")
    parser.add_argument("--scaling", action="store_true")
    parser.add_argument("--lengths", default="128,256,512,1024,2048")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(json.loads(args.worker))
    elif args.mfu:
        print("| size | dtype | device | tokens/s | model TFLOP/s | MFU |")
        print("|---|---|---|---:|---:|---:|")
        for size in args.size.split(","):
            for dtype in args.dtypes.split(","):
                spec = dict(mode="mfu", size=size, dtype=dtype, repeats=args.repeats)
                r = measure({**spec, "warmup": args.warmup})
                if "error" in r:
                    print(f"| {size} | {dtype} | error: {r['error']} | | | |", flush=True)
                    continue
                share = "" if r["mfu"] is None else f"{100 * r['mfu']:.1f}%"
                print(
                    f"| {size} | {dtype} | {r['device']} | {r['tokens_per_sec']:,.0f} | "
                    f"{r['tflops']:.1f} | {share} |",
                    flush=True,
                )
    elif args.payoff:
        print("| context | with memory tok/s | vanilla (stride 1) tok/s | speed-up |")
        print("|---:|---:|---:|---:|")
        for context in (int(c) for c in args.contexts.split(",")):
            r = measure(
                dict(mode="payoff", context=context, repeats=min(args.repeats, 2), size=args.size)
            )
            if "error" in r:
                print(f"| {context} | error: {r['error']} | | |", flush=True)
                continue
            speedup = r["memory_tok_s"] / r["vanilla_tok_s"]
            print(
                f"| {context} | {r['memory_tok_s']:,.0f} | {r['vanilla_tok_s']:,.1f} | "
                f"{speedup:,.0f}x |",
                flush=True,
            )
    elif args.scaling:
        lengths = [int(n) for n in args.lengths.split(",")]
        schemes = args.schemes.split(",") if args.schemes != ",".join(PEERS) else ALL_SCHEMES
        print("train step (forward + backward), batch 1, memory = segment; ms / XLA temp MiB\n")
        print("| scheme | " + " | ".join(f"T={n}" for n in lengths) + " |")
        print("|---|" + "---:|" * len(lengths))
        for scheme in schemes:
            cells = []
            for length in lengths:
                r = measure(
                    dict(mode="scaling", scheme=scheme, length=length, repeats=3, size=args.size)
                )
                cells.append(
                    r.get(
                        "error", f"{1000 * r.get('seconds', 0):,.0f} / {r.get('temp_mib', 0):,.0f}"
                    )
                )
            print(f"| {scheme} | " + " | ".join(cells) + " |", flush=True)
    else:
        side_by_side(args)


if __name__ == "__main__":
    main()
