"""Run in a subprocess by context_parallel_test.py, with 8 simulated CPU devices (XLA_FLAGS set by
the caller).

    python tests/attention/context_worker.py MODE ARG, MODE one of:

    schemes txl,shaw,...   # context 2, 4, 8 vs one device
    train WORKDIR          # (data 2, context 2, tensor 2) vs one
    kernel txl,shaw,...    # the kernels on (data 2, tensor 2) vs one

Prints one JSON line with what the test checks.
"""

from __future__ import annotations

import dataclasses
import json
import pathlib
import sys

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from relpos_jax import TransformerLM, sharding  # noqa: E402
from relpos_jax.config import Config, MeshConfig, load_config  # noqa: E402
from relpos_jax.memory import scan_segments  # noqa: E402


def scheme_config(variant: str) -> Config:
    """One layer of width 16 in tiles of 4 × 4, memory 8, segments of 16; ``variant`` is a scheme
    name, with ``+same_length`` or ``+clamp`` for Transformer-XL's options."""
    position, *options = variant.split("+")
    config = load_config(ROOT / "configs" / "txl_small.py")
    config.model.update(
        position=position, n_layers=1, d_model=16, n_heads=2, d_ff=32, mem_len=8, dropout=0.0,
        attention_impl="tiled", key_tile=4, query_tile=4, shaw={"max_distance": 6},
        t5={"max_distance": 12, "num_buckets": 8}, same_length="same_length" in options,
        clamp_len=5 if "clamp" in options else None,
    )  # fmt: skip
    return Config.from_any(config)


def schemes(variants: list[str]) -> None:
    """Logits of three segments with memory, their loss and every parameter's gradient, on context
    meshes of 2, 4 and 8 devices against no mesh: the largest differences."""
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (3, 2, 16)), jnp.int32)
    result = {}
    for variant in variants:
        cfg = scheme_config(variant)
        graphdef, params, rest = nnx.split(
            TransformerLM(cfg.model, rngs=nnx.Rngs(0)), nnx.Param, ...
        )

        def loss(params, tokens, graphdef=graphdef, rest=rest):
            model = nnx.merge(graphdef, params, rest)
            logits, _ = scan_segments(model, tokens, model.init_mems(tokens.shape[1]))
            return -jnp.mean(jax.nn.log_softmax(logits)[..., 0]), logits

        step = jax.jit(jax.value_and_grad(loss, has_aux=True))
        (loss_one, logits_one), grads_one = step(params, tokens)
        result[variant] = {}
        for blocks in (2, 4, 8):
            mesh = sharding.make_mesh(MeshConfig(data=-1, fsdp=1, tensor=1, context=blocks))
            with jax.set_mesh(mesh):
                split = jax.device_put(
                    tokens, jax.NamedSharding(mesh, jax.P(None, None, "context"))
                )
                (loss_c, logits_c), grads_c = jax.jit(jax.value_and_grad(loss, has_aux=True))(
                    params, split
                )
            result[variant][blocks] = {
                "logits": float(jnp.abs(logits_c - logits_one).max()),
                "loss": abs(float(loss_c - loss_one)),
                "grads": _largest(jax.tree.map(jnp.subtract, grads_c, grads_one))
                / _largest(grads_one),
            }
    print(json.dumps(result))


def kernel(variants: list[str]) -> None:
    """The Pallas kernels (interpreted) on (data 2, fsdp 2, tensor 2), each device its batch rows
    and heads, against one device: logits and gradients of three segments with memory."""
    tokens = jnp.asarray(np.random.default_rng(0).integers(0, 256, (3, 4, 16)), jnp.int32)
    result = {}
    for variant in variants:
        cfg = scheme_config(variant)
        model_cfg = dataclasses.replace(
            cfg.model, d_model=64, n_heads=4, d_ff=64, attention_impl="kernel", kernel_block=16
        )
        graphdef, params, rest = nnx.split(
            TransformerLM(model_cfg, rngs=nnx.Rngs(0)), nnx.Param, ...
        )

        def loss(params, tokens, graphdef=graphdef, rest=rest):
            model = nnx.merge(graphdef, params, rest)
            logits, _ = scan_segments(model, tokens, model.init_mems(tokens.shape[1]))
            return -jnp.mean(jax.nn.log_softmax(logits)[..., 0]), logits

        step = jax.jit(jax.value_and_grad(loss, has_aux=True))
        (_, logits_one), grads_one = step(params, tokens)
        mesh = sharding.make_mesh(MeshConfig(data=2, fsdp=2, tensor=2, context=1))
        with jax.set_mesh(mesh):
            rows = jax.device_put(tokens, jax.NamedSharding(mesh, jax.P(None, ("data", "fsdp"))))
            (_, logits_m), grads_m = jax.jit(jax.value_and_grad(loss, has_aux=True))(params, rows)
        result[variant] = {
            "logits": float(jnp.abs(logits_m - logits_one).max()),
            "grads": _largest(jax.tree.map(jnp.subtract, grads_m, grads_one)) / _largest(grads_one),
        }
    print(json.dumps(result))


def _largest(tree) -> float:
    return max(float(jnp.abs(x).max()) for x in jax.tree.leaves(tree))


def tiny_config(workdir: pathlib.Path, mesh: MeshConfig):
    corpus = workdir.parent / "corpus.txt"
    if not corpus.exists():
        corpus.write_text("".join(f"line {i}: value = {i * 7 % 13}\n" for i in range(3000)))
    config = load_config(ROOT / "configs" / "txl_small.py")
    config.model.update(
        n_layers=2, d_model=32, n_heads=4, d_ff=64, mem_len=8, dropout=0.0,
        attention_impl="tiled", key_tile=4, query_tile=4,
    )  # fmt: skip
    config.data.update(
        name="text", path=str(corpus), dir=str(workdir.parent / "tfds"), segment_len=8, batch_size=4
    )
    config.train.update(
        steps=10, log_every=1, eval_every=0, eval_tokens=256, ckpt_every=0, warmup_steps=0
    )
    config.eval.update(batch_size=2)
    config.mesh.update(data=mesh.data, fsdp=mesh.fsdp, context=mesh.context, tensor=mesh.tensor)
    return config


def losses(workdir: pathlib.Path) -> list[float]:
    from relpos_jax.metrics import read_metrics

    return [m["train/loss"] for m in read_metrics(workdir) if "train/loss" in m]


def train(workdir: pathlib.Path) -> None:
    """Ten steps and the final validation on one device and on (data 2, context 2, tensor 2); then
    generation under the context mesh against none."""
    from relpos_jax import generate
    from relpos_jax.train import Trainer

    one = MeshConfig(data=1, fsdp=1, tensor=1, context=1)
    split = MeshConfig(data=2, fsdp=1, tensor=2, context=2)
    summaries = {}
    for name, mesh in (("one", one), ("split", split)):
        devices = jax.devices()[:1] if name == "one" else None
        trainer = Trainer(tiny_config(workdir / name, mesh), workdir / name, devices=devices)
        summaries[name] = trainer.run()
        if name == "split":
            memory = str(trainer.mems.states.sharding.spec)
            model = trainer.current_model()
    dropping = tiny_config(workdir / "dropatt", split)  # masks drawn per device and key block
    dropping.model.update(dropatt=0.2, dropout=0.1)
    dropping.train.update(steps=3)
    dropped = Trainer(dropping, workdir / "dropatt").run()
    prompt = jnp.asarray(np.random.default_rng(1).integers(0, 256, (1, 8)), jnp.int32)
    alone = generate(model, prompt, 6, rng=jax.random.key(0))
    with jax.set_mesh(sharding.make_mesh(split)):
        under_mesh = generate(model, prompt, 6, rng=jax.random.key(0))
    print(
        json.dumps(
            {
                "one": losses(workdir / "one"),
                "split": losses(workdir / "split"),
                "valid_one": summaries["one"]["valid_bpc"],
                "valid_split": summaries["split"]["valid_bpc"],
                "memory_spec": memory,
                "generated_equal": bool((np.asarray(alone) == np.asarray(under_mesh)).all()),
                "dropatt_losses": losses(workdir / "dropatt"),
                "dropatt_valid": dropped["valid_bpc"],
            }
        )
    )


if __name__ == "__main__":
    if sys.argv[1] == "schemes":
        schemes(sys.argv[2].split(","))
    elif sys.argv[1] == "kernel":
        kernel(sys.argv[2].split(","))
    else:
        directory = pathlib.Path(sys.argv[2])
        directory.mkdir(parents=True, exist_ok=True)
        train(directory)
