"""Naive float64 references, written as loops straight from the papers' formulas.

Each function computes one score (or one output entry) at a time from its definition, with no
vectorisation tricks, so that it can be read against the paper line by line. The fast forms in
``relpos_jax.positions`` are tested against these on random inputs.
"""

from __future__ import annotations

import math

import numpy as np


def sinusoid(position: float, dim: int, base: float = 10000.0) -> np.ndarray:
    """Transformer-XL layout: sin(p·ω_0 … p·ω_{d/2−1}), then cos of the same."""
    out = np.zeros(dim)
    for i in range(dim // 2):
        omega = base ** (-2.0 * i / dim)
        out[i] = math.sin(position * omega)
        out[dim // 2 + i] = math.cos(position * omega)
    return out


def rel_shift(x: np.ndarray) -> np.ndarray:
    """The contract: y[i, j] = x[i, j + Tq − 1 − i] for j ≤ i + Tk − Tq; NaN elsewhere."""
    q_len, k_len = x.shape[-2:]
    y = np.full(x.shape, np.nan)
    for i in range(q_len):
        for j in range(k_len):
            if j <= i + k_len - q_len:
                y[..., i, j] = x[..., i, j + q_len - 1 - i]
    return y


def txl_position_term(q, w_r, v, k_len, clamp_len=None):
    """(q_i + v)ᵀ W_R R_{i−j}, one (b, n, i, j) at a time; query i sits at window position
    Tk − Tq + i. q [B, Tq, N, H], w_r [D, N, H], v [N, H]. NaN where the key is in the future."""
    batch, q_len, heads, _ = q.shape
    dim = w_r.shape[0]
    mem = k_len - q_len
    out = np.full((batch, heads, q_len, k_len), np.nan)
    for b in range(batch):
        for n in range(heads):
            for i in range(q_len):
                for j in range(k_len):
                    distance = (mem + i) - j
                    if distance < 0:
                        continue
                    if clamp_len is not None:
                        distance = min(distance, clamp_len)
                    r = sinusoid(distance, dim) @ w_r[:, n, :]
                    out[b, n, i, j] = float(np.dot(q[b, i, n] + v[n], r))
    return out


def _row(table, index, n):
    return table[index] if table.ndim == 2 else table[index, n]


def shaw_key_logits(q, table, q_pos, k_pos):
    """Shaw et al. eq. (4) position half: q_iᵀ a^K_ij, a_ij = w_clip(j−i, k) = row clip(i−j)+k."""
    batch, q_len, heads, _ = q.shape
    k = (table.shape[0] - 1) // 2
    out = np.zeros((batch, heads, q_len, len(k_pos)))
    for b in range(batch):
        for n in range(heads):
            for i in range(q_len):
                for j in range(len(k_pos)):
                    index = min(max(q_pos[i] - k_pos[j], -k), k) + k
                    out[b, n, i, j] = float(np.dot(q[b, i, n], _row(table, index, n)))
    return out


def shaw_value_output(weights, table, q_pos, k_pos):
    """Shaw et al. eq. (3) position half: Σ_j α_ij a^V_ij."""
    batch, heads, q_len, k_len = weights.shape
    k = (table.shape[0] - 1) // 2
    out = np.zeros((batch, q_len, heads, table.shape[-1]))
    for b in range(batch):
        for n in range(heads):
            for i in range(q_len):
                for j in range(k_len):
                    index = min(max(q_pos[i] - k_pos[j], -k), k) + k
                    out[b, i, n] += weights[b, n, i, j] * _row(table, index, n)
    return out


def gathered_logits(x, table, index, by_key=False):
    """DeBERTa c2p (x = queries: x_i · T[δ(i,j)]) or p2c (x = keys: x_j · T[δ(i,j)])."""
    batch, _, heads, _ = x.shape
    q_len, k_len = index.shape
    out = np.zeros((batch, heads, q_len, k_len))
    for b in range(batch):
        for n in range(heads):
            for i in range(q_len):
                for j in range(k_len):
                    row = x[b, j, n] if by_key else x[b, i, n]
                    out[b, n, i, j] = float(np.dot(row, table[index[i, j], n]))
    return out


def alibi_bias(q_pos, k_pos, slopes):
    out = np.zeros((len(slopes), len(q_pos), len(k_pos)))
    for n, m in enumerate(slopes):
        for i, qp in enumerate(q_pos):
            for j, kp in enumerate(k_pos):
                out[n, i, j] = -m * abs(qp - kp)
    return out


def apply_rope(x, positions, inv_freq, attention_factor=1.0, interleaved=False):
    """Rotate each pair (a, b) by angle m·θ_i with an explicit 2×2 rotation matrix."""
    out = np.array(x, dtype=np.float64)
    half = len(inv_freq)
    time, heads = x.shape[-3], x.shape[-2]
    for t in range(time):
        for n in range(heads):
            for i in range(half):
                a, b = (2 * i, 2 * i + 1) if interleaved else (i, i + half)
                angle = positions[t] * inv_freq[i]
                rotation = attention_factor * np.array(
                    [[math.cos(angle), -math.sin(angle)], [math.sin(angle), math.cos(angle)]]
                )
                pair = np.stack([x[..., t, n, a], x[..., t, n, b]])
                out[..., t, n, a], out[..., t, n, b] = np.tensordot(rotation, pair, axes=1)
    return out


def _softmax_row(scores, allowed):
    scores = np.where(allowed, scores, -np.inf)
    weights = np.exp(scores - scores[allowed].max())
    return weights / weights.sum()


def attention_layer(x, mem, w_q, w_k, w_v, w_o, score_fn, value_fn, allowed_fn):
    """One multi-head attention layer over window = concat(mem, x), one (b, n, i, j) at a time.

    score_fn(b, n, i, j, q_i, k_j) -> the pre-softmax score; value_fn(n, i, j) -> the vector added to
    v_j (zero for most schemes); allowed_fn(i, j) -> may query i see key j. Window coordinates:
    query i sits at M + i, key j at j.
    """
    window = np.concatenate([mem, x], axis=1)
    batch, q_len, _ = x.shape
    k_len = window.shape[1]
    heads, head_dim = w_q.shape[1:]
    out = np.zeros((batch, q_len, w_o.shape[-1]))
    for b in range(batch):
        for n in range(heads):
            for i in range(q_len):
                q_i = x[b, i] @ w_q[:, n]
                scores = np.zeros(k_len)
                allowed = np.array([allowed_fn(i, j) for j in range(k_len)])
                for j in range(k_len):
                    scores[j] = score_fn(b, n, i, j, q_i, window[b, j] @ w_k[:, n])
                weights = _softmax_row(scores, allowed)
                head_out = np.zeros(head_dim)
                for j in range(k_len):
                    if allowed[j]:
                        head_out += weights[j] * (window[b, j] @ w_v[:, n] + value_fn(n, i, j))
                out[b, i] += head_out @ w_o[n]
    return out
