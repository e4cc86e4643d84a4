"""A tour of every position scheme: what each adds between a query and a key d steps back.

    python -m relpos_jax.analysis.demo

Content-free views, so that schemes can be read side by side: ALiBi's bias, the T5 / DeBERTa / Shaw
table rows a distance lands in, the Transformer-XL sinusoid's similarity to distance 0, and RoPE's
mean cos(d·θ) ("long-term decay") for plain RoPE and each length-extension method.
"""

from __future__ import annotations

import jax.numpy as jnp

from relpos_jax import positions as P

DISTANCES = (0, 1, 2, 4, 8, 16, 64, 128, 256, 1024, 4096)
HEAD_DIM = 64
ROPE_SCALINGS = {
    "rope": None,
    "rope+PI x4": {"rope_type": "linear", "factor": 4.0},
    "rope+NTK x4": {"rope_type": "ntk", "factor": 4.0},
    "rope+dynNTK x4": {
        "rope_type": "dynamic",
        "factor": 4.0,
        "original_max_position_embeddings": 512,
    },
    "rope+YaRN x4": {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 512},
    "rope+llama3 x4": {
        "rope_type": "llama3",
        "factor": 4.0,
        "low_freq_factor": 1.0,
        "high_freq_factor": 4.0,
        "original_max_position_embeddings": 512,
    },
}


def scheme_rows() -> dict[str, list[float]]:
    """One row of numbers per scheme, one column per distance in ``DISTANCES``."""
    d = jnp.asarray(DISTANCES)
    zero = jnp.zeros((1,), jnp.int32)
    rows = {
        "alibi head 0 (bias)": P.alibi_bias(d, zero, P.alibi_slopes(8))[0, :, 0],
        "alibi head 7 (bias)": P.alibi_bias(d, zero, P.alibi_slopes(8))[7, :, 0],
        "t5 bucket (causal)": P.t5_bucket(d, bidirectional=False),
        "t5 bucket (bidir)": P.t5_bucket(d, bidirectional=True),
        "deberta bucket": P.deberta_bucket(d),
        "shaw row (k=16)": P.shaw_index(d, 16),
    }
    r = P.sinusoid(d, HEAD_DIM)
    rows["txl R_d·R_0 / |R_0|²"] = r @ r[0] / (r[0] @ r[0])
    for name, scaling in ROPE_SCALINGS.items():
        inv_freq, factor = P.rope_inv_freq(HEAD_DIM, scaling=scaling, seq_len=2048)
        rows[f"{name} mean cos"] = factor**2 * jnp.cos(d[:, None] * inv_freq).mean(-1)
    return {name: [float(v) for v in values] for name, values in rows.items()}


def format_table(rows: dict[str, list[float]]) -> str:
    width = max(map(len, rows)) + 2
    lines = ["distance".ljust(width) + "".join(f"{d:>9d}" for d in DISTANCES)]
    for name, values in rows.items():
        cells = "".join(f"{v:>9.0f}" if float(v).is_integer() else f"{v:>9.3f}" for v in values)
        lines.append(name.ljust(width) + cells)
    return "\n".join(lines)


def main() -> None:
    print("relpos_jax: what each position scheme adds at key distance d = q_pos - k_pos\n")
    print(format_table(scheme_rows()))


if __name__ == "__main__":
    main()
