"""Training-step speed of every scheme, relpos_jax against x-transformers, in one run.

    .venv/bin/python bench/model.py [--steps 5] [--warmup 2] [--schemes txl rope ...]

Needs the ``bench`` extra (``pip install -e .[bench]``: CPU PyTorch and x-transformers). The sizes are
txl_small's: 6 layers, d_model 256, 4 heads of 64, d_ff 1024, segment 128, memory 128, batch 16,
vocabulary 256, dropout 0.1, Adam. Each (library, scheme) runs in its own subprocess, one after the
other, so that its peak resident memory is its own; tokens/s is the median over ``--steps`` timed
training steps (forward, backward, Adam update, memory carried) after ``--warmup`` steps.
x-transformers counterparts: T5 relative bias (``rel_pos_bias``), rotary, ALiBi and absolute.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time

LAYERS, D_MODEL, HEADS, D_FF, SEG, MEM, BATCH, VOCAB = 6, 256, 4, 1024, 128, 128, 16, 256
OURS = ("txl", "shaw", "t5", "deberta", "alibi", "rope", "sinusoid", "learned", "none")
PEERS = {
    "t5": "rel_pos_bias",
    "rope": "rotary_pos_emb",
    "alibi": "alibi_pos_bias",
    "sinusoid": "absolute",
}


def _timed(step, steps: int, warmup: int) -> float:
    for _ in range(warmup):
        step()
    durations = []
    for _ in range(steps):
        start = time.perf_counter()
        step()
        durations.append(time.perf_counter() - start)
    return BATCH * SEG / statistics.median(durations)


def run_ours(scheme: str, steps: int, warmup: int) -> float:
    import jax
    import optax
    from flax import nnx

    from relpos_jax import TransformerLM

    model = TransformerLM(
        dict(
            position=scheme,
            n_layers=LAYERS,
            d_model=D_MODEL,
            n_heads=HEADS,
            d_ff=D_FF,
            mem_len=MEM,
            dropout=0.1,
        ),
        rngs=nnx.Rngs(0),
    )
    optimizer = nnx.Optimizer(model, optax.adam(2.5e-4), wrt=nnx.Param)

    @nnx.jit(donate_argnums=(0, 1))
    def train_step(model, optimizer, tokens, targets, mems):
        def loss_fn(model):
            logits, new_mems = model(tokens, mems, deterministic=False)
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()
            return loss, new_mems

        (loss, new_mems), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
        optimizer.update(model, grads)
        return loss, new_mems

    data = jax.random.randint(jax.random.PRNGKey(0), (BATCH, SEG + 1), 0, VOCAB)
    state = {"mems": model.init_mems(BATCH)}

    def step():
        loss, state["mems"] = train_step(model, optimizer, data[:, :-1], data[:, 1:], state["mems"])
        jax.block_until_ready(loss)

    return _timed(step, steps, warmup)


def run_peer(scheme: str, steps: int, warmup: int) -> float:
    import torch
    from x_transformers import Decoder, TransformerWrapper

    torch.manual_seed(0)
    option = PEERS[scheme]
    layers = Decoder(
        dim=D_MODEL,
        depth=LAYERS,
        heads=HEADS,
        attn_dim_head=D_MODEL // HEADS,
        ff_mult=D_FF // D_MODEL,
        ff_dropout=0.1,
        **({} if option == "absolute" else {option: True}),
    )
    model = TransformerWrapper(
        num_tokens=VOCAB,
        max_seq_len=SEG,
        max_mem_len=MEM,
        attn_layers=layers,
        emb_dropout=0.1,
        tie_embedding=True,
        use_abs_pos_emb=option == "absolute",
    )
    optimizer = torch.optim.Adam(model.parameters(), lr=2.5e-4)
    data = torch.randint(0, VOCAB, (BATCH, SEG + 1))
    state = {"mems": None}

    def step():
        logits, mems = model(data[:, :-1], mems=state["mems"], return_mems=True)
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, VOCAB), data[:, 1:].reshape(-1))
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        state["mems"] = [m.detach() for m in mems]

    model.train()
    return _timed(step, steps, warmup)


def worker(library: str, scheme: str, steps: int, warmup: int) -> None:
    tokens_per_sec = (run_ours if library == "relpos_jax" else run_peer)(scheme, steps, warmup)
    peak_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"tokens_per_sec": tokens_per_sec, "peak_mib": peak_mib}))


def measure(library: str, scheme: str, args) -> dict:
    command = [
        sys.executable,
        __file__,
        "--worker",
        library,
        scheme,
        "--steps",
        str(args.steps),
        "--warmup",
        str(args.warmup),
    ]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode:
        return {"error": (result.stderr.strip().splitlines() or ["failed"])[-1]}
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--schemes", nargs="+", default=list(OURS))
    parser.add_argument("--worker", nargs=2, metavar=("LIBRARY", "SCHEME"))
    args = parser.parse_args()
    if args.worker:
        worker(*args.worker, args.steps, args.warmup)
        return
    print(
        f"train step, {LAYERS} layers, d_model {D_MODEL}, {HEADS}x{D_MODEL // HEADS} heads, d_ff {D_FF}, "
        f"segment {SEG}, memory {MEM}, batch {BATCH}; median of {args.steps} steps after {args.warmup}\n"
    )
    print(
        "| scheme | relpos_jax tok/s | peak MiB | x-transformers | tok/s | peak MiB | ratio ours/peer |"
    )
    print("|---|---:|---:|---|---:|---:|---:|")
    for scheme in args.schemes:
        ours = measure("relpos_jax", scheme, args)
        peer = measure("x-transformers", scheme, args) if scheme in PEERS else None
        ours_cells = (
            f"{ours['tokens_per_sec']:,.0f} | {ours['peak_mib']:,.0f}"
            if "error" not in ours
            else f"error: {ours['error']} | "
        )
        if peer is None:
            peer_cells, ratio = "— | | ", ""
        elif "error" in peer:
            peer_cells, ratio = f"{PEERS[scheme]} | error: {peer['error']} | ", ""
        else:
            peer_cells = (
                f"{PEERS[scheme]} | {peer['tokens_per_sec']:,.0f} | {peer['peak_mib']:,.0f}"
            )
            ratio = (
                f"{ours['tokens_per_sec'] / peer['tokens_per_sec']:.2f}x"
                if "error" not in ours
                else ""
            )
        print(f"| {scheme} | {ours_cells} | {peer_cells} | {ratio} |", flush=True)


if __name__ == "__main__":
    main()
