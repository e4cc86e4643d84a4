"""Speed side by side: relpos_jax against x-transformers (CPU PyTorch) at the same sizes, in one run.

    .venv/bin/python -m bench.speed [--repeats 5] [--warmup 2] [--rounds 3]
        [--schemes txl,t5,rope,alibi,sinusoid] [--dtypes float32,bfloat16] [--tasks train,eval]
        [--size small|base] [--official-txl DIR]

Needs the ``bench`` extra (``pip install -e .[bench]``: CPU PyTorch and x-transformers).
``--official-txl DIR`` adds the official Transformer-XL code as a second peer of ``txl``: ``DIR``
is the ``pytorch`` directory of a checkout of kimiyoung/transformer-xl (``bench.official_txl``), the
same model as ours, run as its authors wrote it.

For each scheme and dtype, training tokens/s (forward, backward, Adam, memory carried) and evaluation
tokens/s (forward with memory, no gradient; relpos_jax scores as ``evaluate`` does: its memory
kept as projected keys and values, ``evaluate.segments_per_call`` segments a compiled call with the
memory carried by ``jax.lax.scan``, while the peers score a segment a call, as their code does, and
project their memory of hidden states again for every segment) of relpos_jax and of its
x-transformers counterpart —
Transformer-XL (ours) and T5 (ours) against x-transformers' T5 relative bias, rope against rotary,
alibi against ALiBi, sinusoid against absolute — at txl_small's sizes (6 layers, d_model 256, 4×64
heads, d_ff 1024, segment 128, memory 128, batch 16, dropout 0.1 in training). Each measurement runs
in its own subprocess (``measure.isolated``), so that peak resident memory is the measurement's own;
tokens/s is the median of ``--repeats`` timed calls after ``--warmup``. Each cell runs ``--rounds``
pairs of processes, ours then the peer's, and reports the medians over the rounds and the ratio of
each pair: this machine is shared, and one pair's ratio moves by up to ±10% from load that neither
process controls. bfloat16 is relpos_jax's ``model.dtype = "bfloat16"`` (bf16 products with float32
accumulation, float32 master weights) against ``torch.autocast("cpu", torch.bfloat16)``.

The other speed benchmarks: ``bench.payoff`` (memory against recomputation), ``bench.scaling`` (time
and memory against segment length), ``bench.mfu`` (model FLOPs utilisation on an accelerator).
"""

from __future__ import annotations

import pathlib
import statistics

from bench import args as options
from bench import official_txl
from bench.measure import SIZES, VOCAB, cell, isolated, median_seconds, our_model, parse_or_serve
from experiments.common import X_TRANSFORMERS, x_transformers_options

TASKS = ("train", "eval")


def dropout_for(task: str) -> float:
    """The dropout rate every library runs ``task`` with: 0.1 in training, none in evaluation."""
    return 0.1 if task == "train" else 0.0


def ours(
    task: str, scheme: str, dtype: str, size: dict, repeats: int, warmup: int, **model_overrides
) -> float:
    """Tokens/s of relpos_jax for ``task`` in {train, eval}; ``model_overrides`` e.g. remat=True.

    Run as ``train.py`` runs: on a CPU one device per core (``cpu_devices``, before JAX starts), the
    batch and the memory split over the mesh's batch axes, the parameters laid out by its rules."""
    from relpos_jax import sharding
    from relpos_jax.config import MeshConfig
    from relpos_jax.ops import cpu_devices

    cpu_devices.one_device_per_core([size["batch"]])
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    mesh = sharding.make_mesh(MeshConfig())
    dropout = dropout_for(task)
    model = our_model(scheme, size, dropout=dropout, dtype=dtype, **model_overrides)
    batch, seg = size["batch"], size["seg"]
    data = jax.random.randint(jax.random.key(0), (batch, seg + 1), 0, VOCAB)
    rows = sharding.batch_sharding(mesh)
    inputs, targets = jax.device_put((data[:, :-1], data[:, 1:]), rows)
    keys_values = task == "eval"  # evaluation keeps keys and values, as ``evaluate`` does
    mems_sharding = sharding.memory_sharding(mesh, keys_values=keys_values)
    mems = model.init_mems(batch, keys_values=keys_values)
    carry = {"mems": jax.device_put(mems, mems_sharding)}
    if task == "eval":  # as ``evaluate`` scores: segments_per_call segments a compiled call
        from relpos_jax import evaluate

        graphdef, state = nnx.split(model)
        state = jax.device_put(state, sharding.state_shardings(state, mesh))
        per_call = evaluate.segments_per_call(batch * seg)
        block = {"inputs": inputs, "targets": targets, "weights": jnp.ones(inputs.shape)}
        block = jax.device_put(
            {k: jnp.stack([v] * per_call) for k, v in block.items()},
            sharding.segments_sharding(mesh),
        )

        def call():
            sums, carry["mems"] = evaluate.score_segments(graphdef, state, block, carry["mems"])
            jax.block_until_ready(sums)

        return per_call * batch * seg / median_seconds(call, repeats, warmup)

    optimizer = nnx.Optimizer(model, optax.adam(2.5e-4), wrt=nnx.Param)
    graphdef, state = nnx.split((model, optimizer))
    state_sharding = sharding.state_shardings(state, mesh)

    def train_step(state, mems, inputs, targets):
        model, optimizer = nnx.merge(graphdef, state)

        def loss_fn(model):
            logits, new_mems = model(inputs, mems, deterministic=False)
            loss = optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()
            return loss, new_mems

        (loss, new_mems), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
        optimizer.update(model, grads)
        return loss, nnx.state((model, optimizer)), new_mems

    train_step = jax.jit(
        train_step,
        out_shardings=(sharding.replicated(mesh), state_sharding, mems_sharding),
        donate_argnums=(0, 1),
    )
    carry["state"] = jax.device_put(state, state_sharding)

    def call():
        loss, carry["state"], carry["mems"] = train_step(
            carry["state"], carry["mems"], inputs, targets
        )
        jax.block_until_ready(loss)

    return batch * seg / median_seconds(call, repeats, warmup)


def peer(task: str, scheme: str, dtype: str, size: dict, repeats: int, warmup: int) -> float:
    """Tokens/s of x-transformers for ``task``, its closest option to ``scheme``."""
    import contextlib

    import torch
    from x_transformers import Decoder, TransformerWrapper

    torch.manual_seed(0)
    option = X_TRANSFORMERS[scheme]
    dropout = dropout_for(task)
    layers = Decoder(
        dim=size["d_model"], depth=size["layers"], heads=size["heads"],
        attn_dim_head=size["d_model"] // size["heads"], ff_mult=size["d_ff"] // size["d_model"],
        ff_dropout=dropout, **x_transformers_options(scheme),
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


def official(
    task: str, scheme: str, dtype: str, size: dict, repeats: int, warmup: int, directory: str
) -> float:
    """Tokens/s of the official Transformer-XL code (``official_txl``) for ``task``."""
    dropout = dropout_for(task)
    lm = official_txl.model(directory, size, VOCAB, dropout)
    call = official_txl.stepper(lm, task, dtype, size, VOCAB)
    return size["batch"] * size["seg"] / median_seconds(call, repeats, warmup)


def peers_of(scheme: str, official_dir: str | None) -> list[tuple[str, str]]:
    """``(library, row label)`` of each peer that has a counterpart of ``scheme``."""
    peers = (
        [("x-transformers", f"x-transformers {X_TRANSFORMERS[scheme]}")]
        if scheme in X_TRANSFORMERS
        else []
    )
    if scheme == "txl" and official_dir:
        peers.append(("official", "official Transformer-XL"))
    return peers


def side_by_side(args) -> None:
    size = SIZES[args.size]
    print(
        f"{size['layers']} layers, d_model {size['d_model']}, {size['heads']} heads, d_ff "
        f"{size['d_ff']}, segment {size['seg']}, memory {size['mem']}, batch {size['batch']}; "
        f"tokens/s, median of {args.repeats} after {args.warmup} in each process; {args.rounds} "
        "rounds of (ours, peer) processes, medians over the rounds\n"
    )
    print("| task | dtype | scheme | relpos_jax tok/s | peak MiB | peer | tok/s | "
          "peak MiB | ours / peer (each round) |")  # fmt: skip
    print("|---|---|---|---:|---:|---|---:|---:|---:|")
    for task in args.tasks:
        for dtype in args.dtypes:
            for scheme in args.schemes:
                spec = dict(
                    task=task, scheme=scheme, dtype=dtype, size=args.size,
                    repeats=args.repeats, warmup=args.warmup, official_txl=args.official_txl,
                )  # fmt: skip
                peers = peers_of(scheme, args.official_txl)
                mine, theirs = [], {library: [] for library, _ in peers}
                for _ in range(args.rounds):  # alternating, so all see the same machine
                    mine.append(isolated("bench.speed", {**spec, "library": "relpos_jax"}))
                    for library, results in theirs.items():
                        results.append(isolated("bench.speed", {**spec, "library": library}))
                for library, label in peers or [(None, None)]:
                    versus = (label, theirs[library]) if library else None
                    print(row(task, dtype, scheme, mine, versus), flush=True)


def row(
    task: str, dtype: str, scheme: str, mine: list[dict], versus: tuple[str, list[dict]] | None
) -> str:
    """One table row: medians over the rounds, and the ratio of each round (ours / peer);
    ``versus`` is the peer's label and its results, round by round."""
    ours_cells = f"{cell(merged(mine), 'tokens_per_sec')} | {cell(merged(mine), 'peak_mib')}"
    if versus is None:
        return f"| {task} | {dtype} | {scheme} | {ours_cells} | — | | | |"
    name, theirs = versus
    peer = merged(theirs)
    ratios = [
        a["tokens_per_sec"] / b["tokens_per_sec"]
        for a, b in zip(mine, theirs, strict=True)
        if "tokens_per_sec" in a and "tokens_per_sec" in b
    ]
    ratio = (
        f"**{statistics.median(ratios):.2f}x** ({', '.join(f'{r:.2f}' for r in ratios)})"
        if ratios
        else ""
    )
    return (
        f"| {task} | {dtype} | {scheme} | {ours_cells} | {name} | "
        f"{cell(peer, 'tokens_per_sec')} | {cell(peer, 'peak_mib')} | {ratio} |"
    )


def merged(results: list[dict]) -> dict:
    """The median of each measurement over the rounds that ran; the first error if none did."""
    good = [r for r in results if "error" not in r]
    if not good:
        return results[0]
    return {key: statistics.median(r[key] for r in good) for key in good[0]}


def worker(spec: dict) -> dict:
    size = SIZES[spec["size"]]
    args = (spec["task"], spec["scheme"], spec["dtype"], size, spec["repeats"], spec["warmup"])
    if spec["library"] == "relpos_jax":
        tokens_per_sec = ours(*args)
    elif spec["library"] == "official":
        tokens_per_sec = official(*args, directory=spec["official_txl"])
    else:
        tokens_per_sec = peer(*args)
    return {"tokens_per_sec": tokens_per_sec}


def main() -> None:
    parser = options.parser(__doc__)
    options.add_timing(
        parser, repeats=5, warmup=2, rounds=3, rounds_help="(ours, peer) process pairs per cell"
    )
    options.add_schemes(
        parser, tuple(X_TRANSFORMERS), help="schemes (those without a peer: ours alone)"
    )
    options.add_dtypes(parser, "float32,bfloat16")
    parser.add_argument("--tasks", type=options.listed(choices=TASKS), default="train,eval")
    options.add_size(parser)
    parser.add_argument(
        "--official-txl",
        metavar="DIR",
        help="the pytorch/ directory of a kimiyoung/transformer-xl checkout: a second txl peer",
    )
    args = parse_or_serve(parser, worker)
    if args is None:
        return
    if args.official_txl and (problem := official_txl.missing(args.official_txl)):
        parser.error(problem)
    if args.official_txl:  # the workers run at the repository root
        args.official_txl = str(pathlib.Path(args.official_txl).expanduser().resolve())
    side_by_side(args)


if __name__ == "__main__":
    main()
