"""The reference backend: numpy, float32 weights (dequantised once at load).

Module functions are the reference ops; `NumpyBackend` puts them behind the seam
(kernels.backend.Backend). Every other backend is tested against this one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import numpy as np

from kernels.backend import Backend
from kernels.kv_cache import KVCache
from kernels.quants import dequantize_rows
from kernels.weights import RopeTable, Weight

xp = np


def array_module(x):
    """numpy, or CuPy for a CuPy array. The reference ops below take their array module
    from their input, so the GPU backend's logic (kernels/xp/backend.py) runs these same
    lines on the device; on numpy nothing changes."""
    if type(x).__module__.startswith("cupy"):
        import cupy

        return cupy
    return np


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    # Mean of squares in float32, as llama.cpp and the PyTorch reference do.
    xp = array_module(x)
    ms = xp.mean(x * x, axis=-1, keepdims=True)
    return x * (1.0 / xp.sqrt(ms + eps)) * weight


def rope_tables(
    n_pos: int, rot_dim: int, base: float, factors=None, attn_factor: float = 1.0
) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin tables, (n_pos, rot_dim // 2), computed in float64 then stored float32.
    `factors` (rot_dim // 2,) divide the frequencies and `attn_factor` scales cos and sin
    (LongRoPE, as llama.cpp's rope with freq factors and transformers' longrope do)."""
    inv_freq = base ** (-np.arange(0, rot_dim, 2, dtype=np.float64) / rot_dim)
    if factors is not None:
        inv_freq = inv_freq / np.asarray(factors, dtype=np.float64)
    angles = np.outer(np.arange(n_pos, dtype=np.float64), inv_freq)
    cos, sin = np.cos(angles), np.sin(angles)
    if attn_factor != 1.0:
        cos, sin = cos * attn_factor, sin * attn_factor
    return cos.astype(np.float32), sin.astype(np.float32)


def apply_rope_interleaved(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate adjacent pairs (x[2i], x[2i+1]): GGUF `llama` stores Q/K rows permuted for this.

    x: (T, H, Dh); cos/sin: (T, Dh // 2).
    """
    T, H, Dh = x.shape
    pairs = x.reshape(T, H, Dh // 2, 2)
    x0, x1 = pairs[..., 0], pairs[..., 1]
    c, s = cos[:, None, :], sin[:, None, :]
    out = array_module(x).empty_like(pairs)
    out[..., 0] = x0 * c - x1 * s
    out[..., 1] = x0 * s + x1 * c
    return out.reshape(T, H, Dh)


def apply_rope_neox(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate the two halves (x[i], x[i + Dh/2]): qwen2/qwen3 style, unpermuted rows."""
    half = x.shape[-1] // 2
    x0, x1 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return array_module(x).concatenate([x0 * c - x1 * s, x0 * s + x1 * c], axis=-1)


def softmax_inplace(x: np.ndarray) -> np.ndarray:
    x -= x.max(axis=-1, keepdims=True)
    array_module(x).exp(x, out=x)
    x /= x.sum(axis=-1, keepdims=True)
    return x


def silu(x: np.ndarray) -> np.ndarray:
    # exp(-x) overflows to inf below x = -88 (float32), and x / inf is the right limit, -0.
    xp = array_module(x)
    with np.errstate(over="ignore") if xp is np else contextlib.nullcontext():
        return x / (1.0 + xp.exp(-x))


def gelu_tanh(x: np.ndarray) -> np.ndarray:
    xp = array_module(x)
    return 0.5 * x * (1.0 + xp.tanh(np.float32(0.7978845608) * (x + np.float32(0.044715) * x**3)))


ACTIVATIONS = {"silu": silu, "gelu_tanh": gelu_tanh}

# gpt-oss's SwiGLU (transformers' GptOssExperts, llama.cpp's SWIGLU_OAI): the gate clamped
# above at 7, the up clamped to [-7, 7], out = (up + 1) * gate * sigmoid(1.702 * gate).
SWIGLU_OAI_ALPHA = np.float32(1.702)
SWIGLU_OAI_LIMIT = np.float32(7.0)


def swiglu_oai(gate: np.ndarray, up: np.ndarray) -> np.ndarray:
    xp = array_module(gate)
    gate = xp.minimum(gate, SWIGLU_OAI_LIMIT)
    up = xp.clip(up, -SWIGLU_OAI_LIMIT, SWIGLU_OAI_LIMIT)
    with np.errstate(over="ignore") if xp is np else contextlib.nullcontext():
        glu = gate / (np.float32(1.0) + xp.exp(-SWIGLU_OAI_ALPHA * gate))
    return (up + np.float32(1.0)) * glu


def gated(gate_up: np.ndarray, d_ff: int, activation: str) -> np.ndarray:
    """The gated FFN's hidden values from a fused (n, 2F) gate/up product."""
    gate, up = gate_up[:, :d_ff], gate_up[:, d_ff:]
    if activation == "swiglu_oai":
        return swiglu_oai(gate, up)
    return ACTIVATIONS[activation](gate) * up


def softmax_with_sinks(scores: np.ndarray, sinks) -> np.ndarray:
    """Softmax over the last axis in place, with a per-head sink logit (gpt-oss) in each
    denominator: sinks broadcast against scores[..., :1]. The sink takes no value."""
    xp = array_module(scores)
    mx = xp.maximum(scores.max(axis=-1, keepdims=True), sinks)
    scores -= mx
    xp.exp(scores, out=scores)
    scores /= scores.sum(axis=-1, keepdims=True) + xp.exp(sinks - mx)
    return scores


def attend(
    q: np.ndarray,
    keys: np.ndarray,
    values: np.ndarray,
    start: int,
    scale: float,
    window: int = 0,
    softcap: float = 0.0,
    sinks=None,
) -> np.ndarray:
    """Causal grouped-query attention of T queries at positions start.. over the keys and
    values of positions 0..end. q: (T, H, Dh); keys/values: (Hkv, end, Dh). Query head h
    reads KV head h // (H / Hkv), as llama.cpp broadcasts GQA. `window` > 0 also hides
    keys `window` or more positions behind the query (sliding-window layers). `sinks`
    (H,): a logit per query head joining each softmax's denominator (gpt-oss).
    Returns (T, H * Dh)."""
    T, H, Dh = q.shape
    Hkv, end, _ = keys.shape
    group = H // Hkv
    xp = array_module(q)
    q_pos = xp.arange(start, start + T)[:, None]
    k_pos = xp.arange(end)[None, :]
    hidden = k_pos > q_pos
    if window > 0:
        hidden |= q_pos - k_pos >= window
    qg = q.reshape(T, Hkv, group, Dh).transpose(1, 2, 0, 3)  # (Hkv, group, T, Dh)
    scores = (qg * q.dtype.type(scale)) @ keys[:, None].transpose(
        0, 1, 3, 2
    )  # (Hkv, group, T, end)
    if softcap > 0:
        scores = softcap_values(scores, softcap)
    scores[..., hidden] = -np.inf
    if sinks is None:
        softmax_inplace(scores)
    else:
        softmax_with_sinks(scores, sinks.reshape(Hkv, group, 1, 1))
    out = scores @ values[:, None]  # (Hkv, group, T, Dh)
    return out.transpose(2, 0, 1, 3).reshape(T, H * Dh)


def attend_one(
    q: np.ndarray,
    keys: np.ndarray,
    values: np.ndarray,
    scale: float,
    softcap: float = 0.0,
    sinks=None,
) -> np.ndarray:
    """One query position over every key given: q (H, Dh); keys/values (Hkv, n, Dh).
    Returns (H * Dh,). The decode row's attention (no mask: the caller passes only the
    keys the query may see)."""
    H, Dh = q.shape
    Hkv = keys.shape[0]
    qg = q.reshape(Hkv, H // Hkv, 1, Dh)
    scores = (qg * q.dtype.type(scale)) @ keys[:, None].transpose(0, 1, 3, 2)  # (Hkv, g, 1, n)
    if softcap > 0:
        scores = softcap_values(scores, softcap)
    if sinks is None:
        softmax_inplace(scores)
    else:
        softmax_with_sinks(scores, sinks.reshape(Hkv, H // Hkv, 1, 1))
    return (scores @ values[:, None]).reshape(H * Dh)


def softcap_values(x: np.ndarray, cap: float) -> np.ndarray:
    c = x.dtype.type(cap)
    return c * array_module(x).tanh(x / c)


# Weight bytes per GEMV call in `linear_rows`: small enough that a chunk stays in the
# last-level cache while every row of the batch reads it (32 MiB L3 on the machine this
# was measured on), large enough that the per-call overhead stays small.
ROW_CHUNK_BYTES = 8 << 20


def row_chunks(w: np.ndarray) -> list[tuple[int, int]]:
    """Fixed [begin, end) ranges of w's rows for `linear_rows` (multiples of 64 rows)."""
    n, k = w.shape
    return chunk_ranges(n, k, w.itemsize)


def chunk_ranges(n: int, k: int, itemsize: int) -> list[tuple[int, int]]:
    """[begin, end) ranges over n rows of k values each, ROW_CHUNK_BYTES of values apiece."""
    rows = max(64, ROW_CHUNK_BYTES // (k * itemsize) // 64 * 64)
    return [(i, min(n, i + rows)) for i in range(0, n, rows)]


def linear_rows(x: np.ndarray, w: np.ndarray, chunks: list[tuple[int, int]]) -> np.ndarray:
    """x (B, K) @ w.T (w: (N, K)) computed row by row: batch invariant by construction.

    Each row of x is one GEMV per fixed chunk of w's rows, so row b's result is the same
    bits whatever the other rows are and however many there are (a (B, K) GEMM is not:
    BLAS picks kernels and blocking by shape, and a single row goes through GEMV). The
    chunk is read from memory once and from cache for the other rows, so B rows cost
    far less than B separate passes (bench/RESULTS.md).
    """
    B = x.shape[0]
    out = np.empty((B, 1, w.shape[0]), dtype=np.float32)
    rows = x[:, None, :]  # (B, 1, K): a stack of row vectors, one GEMV each
    for begin, end in chunks:
        np.matmul(rows, w[begin:end].T, out=out[:, :, begin:end])
    return out[:, 0]


class NumpyBackend(Backend):
    """numpy on the host. Dense weights are used as given (float32, often memory-mapped
    from the weight cache); block weights are dequantised a cache-sized chunk of rows at
    a time on every use — correct everywhere, fast nowhere (a fallback, and the oracle a
    compiled kernel is checked against)."""

    name = "numpy"
    dtype = np.dtype(np.float32)

    def _float(self, array: np.ndarray) -> np.ndarray:
        return np.asarray(array, dtype=self.dtype)

    # ---- weights ----

    def dense_weight(self, array: np.ndarray) -> Weight:
        array = self._float(array)
        storage = {4: "f32", 8: "f64", 2: "f16"}[array.itemsize]
        return Weight(storage, tuple(array.shape), array, {"chunks": row_chunks(array)})

    def block_weight(self, blocks, qtype, shape) -> Weight:
        n, k = shape
        chunks = chunk_ranges(n, k, self.dtype.itemsize)  # as dense rows of this dtype
        return Weight(qtype.name, (int(n), int(k)), blocks, {"qtype": qtype, "chunks": chunks})

    def vector(self, array: np.ndarray) -> np.ndarray:
        return self._float(array)

    def _dense(self, w: Weight, begin: int = 0, end: int | None = None) -> np.ndarray:
        if not w.is_blocks:
            return w.data[begin:end]
        return dequantize_rows(w.data[begin:end], w.meta["qtype"], self.dtype)

    # ---- ops ----

    def embed(self, table: Weight, token_ids: np.ndarray) -> np.ndarray:
        ids = np.asarray(token_ids, dtype=np.int64)
        if not table.is_blocks:
            return table.data[ids]
        return dequantize_rows(table.data[ids], table.meta["qtype"], self.dtype)

    def linear(self, x: np.ndarray, w: Weight) -> np.ndarray:
        if not w.is_blocks:
            return linear_rows(x, w.data, w.meta["chunks"])
        # Same shape of computation as linear_rows, one dequantised chunk at a time.
        B = x.shape[0]
        out = np.empty((B, 1, w.shape[0]), dtype=x.dtype)
        rows = x[:, None, :]
        for begin, end in w.meta["chunks"]:
            np.matmul(rows, self._dense(w, begin, end).T, out=out[:, :, begin:end])
        return out[:, 0]

    def linear_prefill(self, x: np.ndarray, w: Weight) -> np.ndarray:
        return x @ self._dense(w).T

    def rms_norm(self, x, weight, eps):
        return rms_norm(x, weight, eps)

    def rope_table(self, n_pos, dim, base, factors=None, attn_factor=1.0) -> RopeTable:
        cos, sin = rope_tables(n_pos, dim, base, factors, attn_factor)
        return RopeTable(self._float(cos), self._float(sin))

    def rope(self, x, positions, table: RopeTable, neox: bool):
        cos, sin = table.cos[positions], table.sin[positions]
        return apply_rope_neox(x, cos, sin) if neox else apply_rope_interleaved(x, cos, sin)

    def glu(self, gate_up, d_ff: int, activation: str):
        return gated(gate_up, d_ff, activation)

    def softcap(self, x, cap: float):
        return softcap_values(x, cap)

    # ---- attention ----

    def make_kv_cache(
        self, n_layer, n_slots, n_kv_head, n_ctx, head_dim, kv_dtype="f32"
    ) -> KVCache:
        return KVCache(n_layer, n_slots, n_kv_head, n_ctx, head_dim, self.dtype, kv_dtype)

    attention_sinks = True

    def attention_prefill(
        self, q, k, v, kv, layer, slot, start, scale, window=0, softcap=0.0, sinks=None
    ):
        end = start + q.shape[0]
        kv.write(layer, slot, start, k.transpose(1, 0, 2), v.transpose(1, 0, 2))
        keys, values = kv.view(layer, slot, end)  # (Hkv, end, Dh)
        return attend(q, keys, values, start, scale, window, softcap, sinks)

    def attention_prefill_packed(
        self, q, k, v, kv, layer, chunks, scale, window=0, softcap=0.0, sinks=None
    ):
        # Chunk by chunk, the calls `attention_prefill` makes for each alone (the numpy
        # reference itself does not set packs_prefill; the compiled backend inherits this).
        parts, row = [], 0
        for slot, start, n in chunks:
            rows = slice(row, row + n)
            parts.append(
                self.attention_prefill(
                    q[rows], k[rows], v[rows], kv, layer, slot, start, scale, window, softcap, sinks
                )
            )
            row += n
        return np.concatenate(parts)

    def attention_decode(
        self,
        q,
        k,
        v,
        kv,
        layer,
        slots: Sequence[int],
        positions,
        scale,
        window=0,
        softcap=0.0,
        sinks=None,
    ):
        B, H, Dh = q.shape
        out = array_module(q).empty((B, H * Dh), dtype=q.dtype)
        for b in range(B):
            slot, p = int(slots[b]), int(positions[b])
            kv.write(layer, slot, p, k[b][:, None], v[b][:, None])
            keys, values = kv.view(layer, slot, p + 1)  # (Hkv, p + 1, Dh)
            if window > 0 and p + 1 > window:  # a sliding-window layer sees the last `window`
                keys, values = keys[:, p + 1 - window :], values[:, p + 1 - window :]
            out[b] = attend_one(q[b], keys, values, scale, softcap, sinks)
        return out

    def to_host(self, x) -> np.ndarray:
        return np.asarray(x)
