"""Reference array ops in numpy (float32). The CuPy path must match these."""

from __future__ import annotations

import numpy as np

xp = np


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float) -> np.ndarray:
    # Mean of squares in float32, as llama.cpp and the PyTorch reference do.
    ms = np.mean(x * x, axis=-1, keepdims=True)
    return x * (1.0 / np.sqrt(ms + eps)) * weight


def rope_tables(n_pos: int, rot_dim: int, base: float) -> tuple[np.ndarray, np.ndarray]:
    """cos/sin tables, (n_pos, rot_dim // 2), computed in float64 then stored float32."""
    inv_freq = base ** (-np.arange(0, rot_dim, 2, dtype=np.float64) / rot_dim)
    angles = np.outer(np.arange(n_pos, dtype=np.float64), inv_freq)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def apply_rope_interleaved(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate adjacent pairs (x[2i], x[2i+1]): GGUF `llama` stores Q/K rows permuted for this.

    x: (T, H, Dh); cos/sin: (T, Dh // 2).
    """
    T, H, Dh = x.shape
    pairs = x.reshape(T, H, Dh // 2, 2)
    x0, x1 = pairs[..., 0], pairs[..., 1]
    c, s = cos[:, None, :], sin[:, None, :]
    out = np.empty_like(pairs)
    out[..., 0] = x0 * c - x1 * s
    out[..., 1] = x0 * s + x1 * c
    return out.reshape(T, H, Dh)


def apply_rope_neox(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate the two halves (x[i], x[i + Dh/2]): qwen2/qwen3 style, unpermuted rows."""
    half = x.shape[-1] // 2
    x0, x1 = x[..., :half], x[..., half:]
    c, s = cos[:, None, :], sin[:, None, :]
    return np.concatenate([x0 * c - x1 * s, x0 * s + x1 * c], axis=-1)


def softmax_inplace(x: np.ndarray) -> np.ndarray:
    x -= x.max(axis=-1, keepdims=True)
    np.exp(x, out=x)
    x /= x.sum(axis=-1, keepdims=True)
    return x


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


# Weight bytes per GEMV call in `linear_rows`: small enough that a chunk stays in the
# last-level cache while every row of the batch reads it (32 MiB L3 on the machine this
# was measured on), large enough that the per-call overhead stays small.
ROW_CHUNK_BYTES = 8 << 20


def row_chunks(w: np.ndarray) -> list[tuple[int, int]]:
    """Fixed [begin, end) ranges of w's rows for `linear_rows` (multiples of 64 rows)."""
    n, k = w.shape
    rows = max(64, ROW_CHUNK_BYTES // (k * w.itemsize) // 64 * 64)
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
