"""Position terms, fast form against the explicit ``[Tq, Tk, H]`` construction.

    .venv/bin/python -m bench.positions [--lengths 256 512 1024 2048 4096] [--repeats 5]

For a key window of ``Tk`` positions (memory ``M = Tk/2`` then a segment of ``Tq = Tk/2`` queries):

* Transformer-XL ``(q + v)·W_R·R_{i−j}``: ``rel_shift`` of ``[Tq, Tk]`` scores against gathering
  ``W_R R`` per (i, j) pair into ``[Tq, Tk, N, H]``;
* Shaw et al. key logits + value outputs: ``_buckets`` (project on the 2k + 1 rows, gather / scatter,
  one matmul) against gathering ``a^K_ij``, ``a^V_ij`` into ``[Tq, Tk, H]``.

Time is the median wall time of ``--repeats`` jitted calls after a warm-up; memory is XLA's own
account of the compiled program's temporaries (``memory_analysis().temp_size_in_bytes``), which is
deterministic, plus its output. Results go to stdout as a markdown table.
"""

from __future__ import annotations

import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from bench import args as options
from relpos_jax import positions as P

BATCH, HEADS, HEAD_DIM, SHAW_K = 1, 4, 32, 64


def txl_fast(q, r, v):
    return P.txl_position_logits(q, r, v)


def txl_explicit(q, r, v):
    k_len, q_len = r.shape[0], q.shape[1]
    distance = (k_len - q_len + jnp.arange(q_len))[:, None] - jnp.arange(k_len)[None, :]
    rows = k_len - 1 - jnp.clip(distance, 0, k_len - 1)  # r holds distances Tk − 1 … 0
    r_QKNH = r[rows]
    return jnp.einsum("bqnh,qknh->bnqk", q + v, r_QKNH)


def shaw_fast(q, weights, table_k, table_v, q_pos, k_pos):
    logits = P.shaw_key_logits(q, table_k, q_pos, k_pos)
    return logits, P.shaw_value_output(weights, table_v, q_pos, k_pos)


def shaw_explicit(q, weights, table_k, table_v, q_pos, k_pos):
    index = P.shaw_rel_index(q_pos, k_pos, (table_k.shape[0] - 1) // 2)
    a_k_QKH, a_v_QKH = table_k[index], table_v[index]
    logits = jnp.einsum("bqnh,qkh->bnqk", q, a_k_QKH)
    return logits, jnp.einsum("bnqk,qkh->bqnh", weights, a_v_QKH)


def measure(fn, args, repeats):
    compiled = jax.jit(fn).lower(*args).compile()
    memory = compiled.memory_analysis()
    out = compiled(*args)
    jax.block_until_ready(out)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        jax.block_until_ready(compiled(*args))
        times.append(time.perf_counter() - start)
    return statistics.median(times), memory.temp_size_in_bytes, memory.output_size_in_bytes, out


def inputs(k_len):
    q_len = k_len // 2
    keys = jax.random.split(jax.random.PRNGKey(0), 6)
    q = jax.random.normal(keys[0], (BATCH, q_len, HEADS, HEAD_DIM))
    r = jax.random.normal(keys[1], (k_len, HEADS, HEAD_DIM))
    v = jax.random.normal(keys[2], (HEADS, HEAD_DIM))
    weights = jax.nn.softmax(jax.random.normal(keys[3], (BATCH, HEADS, q_len, k_len)), -1)
    table_k = jax.random.normal(keys[4], (2 * SHAW_K + 1, HEAD_DIM))
    table_v = jax.random.normal(keys[5], (2 * SHAW_K + 1, HEAD_DIM))
    k_pos = jnp.arange(k_len)
    return (q, r, v), (q, weights, table_k, table_v, k_pos[k_len - q_len :], k_pos)


def causal_max_diff(a, b):
    q_len, k_len = a.shape[-2:]
    causal = np.arange(k_len)[None, :] <= np.arange(q_len)[:, None] + (k_len - q_len)
    return float(np.max(np.abs(np.asarray(a) - np.asarray(b))[..., causal]))


def main() -> None:
    parser = options.parser(__doc__)
    parser.add_argument("--lengths", type=int, nargs="+", default=[256, 512, 1024, 2048, 4096])
    options.add_timing(parser, repeats=5)
    args = parser.parse_args()
    mib = 2.0**-20
    print(
        f"jax {jax.__version__} on {jax.devices()[0].device_kind}; B={BATCH} N={HEADS} "
        f"H={HEAD_DIM} Shaw k={SHAW_K}; Tq = Tk/2 queries after M = Tk/2 memory slots\n"
    )
    print(
        "| term | Tk | fast ms | explicit ms | speed-up | fast temp MiB | explicit temp MiB "
        "| output MiB | max abs diff |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for k_len in args.lengths:
        txl_args, shaw_args = inputs(k_len)
        for name, fast, explicit, fn_args in (
            ("txl rel_shift", txl_fast, txl_explicit, txl_args),
            ("shaw key+value", shaw_fast, shaw_explicit, shaw_args),
        ):
            t_fast, m_fast, out_bytes, y_fast = measure(fast, fn_args, args.repeats)
            t_exp, m_exp, _, y_exp = measure(explicit, fn_args, args.repeats)
            if name.startswith("txl"):
                diff = causal_max_diff(y_fast, y_exp)
            else:
                diff = max(
                    float(jnp.max(jnp.abs(a - b))) for a, b in zip(y_fast, y_exp, strict=True)
                )
            print(
                f"| {name} | {k_len} | {t_fast * 1e3:.1f} | {t_exp * 1e3:.1f} | {t_exp / t_fast:.1f}x "
                f"| {m_fast * mib:.1f} | {m_exp * mib:.1f} | {out_bytes * mib:.1f} | {diff:.1e} |",
                flush=True,
            )
            del y_fast, y_exp


if __name__ == "__main__":
    main()
