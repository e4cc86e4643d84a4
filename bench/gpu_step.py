"""The training step that ``bench.gpu`` measures, built as ``train.py``'s ``Trainer`` builds it.

``Step(size, impl=..., remat=..., overrides=[...])`` is configs/txl_base_enwik8.py at a
``bench.measure.SIZES``-like size, with config overrides such as ``"model.position=rope"``:
``relpos_jax.train_step.jitted_train_step`` over the model and optimizer state, sharded by
``relpos_jax.sharding``; ``compile()`` lowers it for abstract inputs and records the seconds, whether
the persistent compilation cache answered (``CacheHits``) and XLA's memory for the program;
``inputs()`` makes real state, a batch of random tokens and empty memory; ``run_steps`` times it.
"""

from __future__ import annotations

import os
import time

from bench.measure import ROOT

CONFIG = ROOT / "configs" / "txl_base_enwik8.py"


class CacheHits:
    """Counts the persistent compilation cache's hits (``jax.monitoring`` events); ``count`` is
    None where this JAX has no such events to listen to."""

    count: int | None = 0

    @classmethod
    def install(cls) -> None:
        import jax

        def listen(event: str, **kwargs) -> None:
            if event == "/jax/compilation_cache/cache_hits" and cls.count is not None:
                cls.count += 1

        try:
            jax.monitoring.register_event_listener(listen)
        except AttributeError:
            cls.count = None


def enable_cache() -> None:
    """JAX's persistent compilation cache, every program in it (``JAX_COMPILATION_CACHE_DIR``)."""
    import jax

    cache = os.environ.get("JAX_COMPILATION_CACHE_DIR") or "/tmp/jax_cache"
    settings = {
        "jax_compilation_cache_dir": cache,
        "jax_persistent_cache_min_compile_time_secs": 0,
        "jax_persistent_cache_min_entry_size_bytes": 0,
    }
    for name, value in settings.items():
        try:
            jax.config.update(name, value)
        except AttributeError:  # a setting this JAX does not have
            print(f"  (this jax has no {name})", flush=True)
    CacheHits.install()


class Step:
    """The training step of configs/txl_base_enwik8.py at ``size``, built as ``Trainer`` builds it."""

    def __init__(self, size: dict, *, dtype: str = "bfloat16", impl: str = "dense", remat=False,
                 overrides=()):  # fmt: skip
        import jax
        import jax.numpy as jnp
        from flax import nnx

        from relpos_jax import sharding
        from relpos_jax.config import Config, load_config
        from relpos_jax.memory import init_mems
        from relpos_jax.model import TransformerLM
        from relpos_jax.train_step import jitted_train_step, make_optimizer

        s = size
        overrides = [
            f"model.n_layers={s['layers']}", f"model.d_model={s['d_model']}",
            f"model.n_heads={s['heads']}", f"model.d_ff={s['d_ff']}", f"model.mem_len={s['mem']}",
            f"model.dtype={dtype}", f"model.attention_impl={impl}", f"model.remat={remat}",
            f"data.segment_len={s['seg']}", f"data.batch_size={s['batch']}", *overrides,
        ]  # fmt: skip
        self.cfg = cfg = Config.from_any(load_config(CONFIG, overrides))
        self.size, self.mesh = size, sharding.make_mesh(cfg.mesh)

        def build():
            model = TransformerLM(cfg.model, rngs=nnx.Rngs(params=0, dropout=1))
            return model, nnx.Optimizer(model, make_optimizer(cfg.train), wrt=nnx.Param)

        self.build = build
        self.graphdef, abstract = nnx.split(nnx.eval_shape(build))
        self.state_sharding = sharding.state_shardings(abstract, self.mesh)
        leaves, treedef = jax.tree.flatten(self.state_sharding)
        self.jitted = jitted_train_step(
            self.graphdef, cfg.train.grad_accum, (treedef, tuple(leaves)), self.mesh
        )
        m = cfg.model
        self.init_mems = lambda: init_mems(m.n_layers, s["batch"], m.mem_len, m.d_model, m.dtype)
        self.mems_sharding = sharding.memory_sharding(self.mesh)
        shaped = lambda tree, shardings: jax.tree.map(  # noqa: E731
            lambda a, sh: jax.ShapeDtypeStruct(a.shape, a.dtype, sharding=sh), tree, shardings
        )
        batch = jax.ShapeDtypeStruct((s["batch"], s["seg"]), jnp.int32)
        rows = sharding.batch_sharding(self.mesh)
        self.abstract = (
            shaped(abstract, self.state_sharding),
            {k: jax.ShapeDtypeStruct(batch.shape, batch.dtype, sharding=rows) for k in ("inputs", "targets")},
            shaped(jax.eval_shape(self.init_mems), self.mems_sharding),
        )  # fmt: skip

    def compile(self) -> tuple[object, dict]:
        """The compiled step and its compile record: lower and compile seconds, cache hit, memory."""
        hits = CacheHits.count
        start = time.perf_counter()
        lowered = self.jitted.lower(*self.abstract)
        lowered_at = time.perf_counter()
        compiled = lowered.compile()
        done = time.perf_counter()
        record = {
            "lower_s": lowered_at - start, "compile_s": done - start,
            "cache_hit": None if hits is None else CacheHits.count > hits, **memory(compiled),
        }  # fmt: skip
        return compiled, record

    def inputs(self) -> tuple:
        """Real state, batch and empty memory, laid out as the compiled step takes them."""
        import jax
        import numpy as np
        from flax import nnx

        from relpos_jax import sharding

        state = jax.jit(lambda: nnx.split(self.build())[1], out_shardings=self.state_sharding)()
        mems = jax.jit(self.init_mems, out_shardings=self.mems_sharding)()
        data = np.random.default_rng(0).integers(0, 256, (self.size["batch"], self.size["seg"] + 1))
        batch = {"inputs": data[:, :-1].astype(np.int32), "targets": data[:, 1:].astype(np.int32)}
        return state, sharding.global_batch(batch, self.mesh), mems


def memory(compiled) -> dict:
    """XLA's buffer assignment for a program: arguments + outputs − aliased + temporaries, GiB."""
    try:
        m = compiled.memory_analysis()
        total = (
            m.argument_size_in_bytes + m.output_size_in_bytes - m.alias_size_in_bytes
            + m.temp_size_in_bytes
        )  # fmt: skip
        return {"program_gib": total / 2**30, "temp_gib": m.temp_size_in_bytes / 2**30}
    except Exception:  # not every backend reports it
        return {}


def run_steps(compiled, state, batch, mems, *, warmup: int, repeats: int):
    """Warm-up, then ``repeats`` synchronised steps (their times) and ``repeats`` pipelined ones
    (their mean); returns (synchronised step seconds, pipelined mean, state, memory)."""
    import jax

    for _ in range(warmup):
        state, mems, metrics = compiled(state, batch, mems)
    jax.block_until_ready(metrics)
    synced = []
    for _ in range(repeats):
        start = time.perf_counter()
        state, mems, metrics = compiled(state, batch, mems)
        jax.block_until_ready(metrics)
        synced.append(time.perf_counter() - start)
    start = time.perf_counter()
    for _ in range(repeats):
        state, mems, metrics = compiled(state, batch, mems)
    jax.block_until_ready((state, mems, metrics))
    return synced, (time.perf_counter() - start) / repeats, state, mems
