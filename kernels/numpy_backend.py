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
