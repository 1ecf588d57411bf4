"""Pieces every architecture file shares: tensor loading with progress, and attention."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kernels import numpy_backend as ops

from ..gguf_file import GGUFFile
from ..types import ModelLoadError


def tensor_loader(
    gf: GGUFFile, progress: Callable[[int, int], None] | None
) -> Callable[..., np.ndarray | None]:
    """`load(name, optional=False)`: one tensor as float32, reporting (done, total)."""
    total = len(gf.tensors)
    done = 0

    def load(name: str, optional: bool = False) -> np.ndarray | None:
        nonlocal done
        if not gf.has_tensor(name):
            if optional:
                return None
            raise ModelLoadError(f"tensor {name!r} missing from {gf.path.name}")
        array = gf.load_f32(name)
        done += 1
        if progress is not None:
            progress(done, total)
        return array

    return load


def attend(
    q: np.ndarray,
    keys: np.ndarray,
    values: np.ndarray,
    start: int,
    scale: float,
    window: int = 0,
) -> np.ndarray:
    """Causal grouped-query attention of T queries at positions start.. over the keys and
    values of positions 0..end. q: (T, H, Dh); keys/values: (Hkv, end, Dh). Query head h
    reads KV head h // (H / Hkv), as llama.cpp broadcasts GQA. `window` > 0 also hides
    keys `window` or more positions behind the query (sliding-window layers).
    Returns (T, H * Dh)."""
    T, H, Dh = q.shape
    Hkv, end, _ = keys.shape
    group = H // Hkv
    q_pos = np.arange(start, start + T)[:, None]
    k_pos = np.arange(end)[None, :]
    hidden = k_pos > q_pos
    if window > 0:
        hidden |= q_pos - k_pos >= window
    qg = q.reshape(T, Hkv, group, Dh).transpose(1, 2, 0, 3)  # (Hkv, group, T, Dh)
    scores = (qg * np.float32(scale)) @ keys[:, None].transpose(0, 1, 3, 2)  # (Hkv, group, T, end)
    scores[..., hidden] = -np.inf
    ops.softmax_inplace(scores)
    out = scores @ values[:, None]  # (Hkv, group, T, Dh)
    return out.transpose(2, 0, 1, 3).reshape(T, H * Dh)
