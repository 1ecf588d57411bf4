"""Preallocated per-slot KV cache, written by index.

np.zeros maps pages lazily, so a large window costs memory only as it fills.
"""

from __future__ import annotations

import numpy as np


class KVCache:
    def __init__(self, n_layer: int, n_slots: int, n_kv_head: int, n_ctx: int, head_dim: int):
        shape = (n_layer, n_slots, n_kv_head, n_ctx, head_dim)
        self.k = np.zeros(shape, dtype=np.float32)
        self.v = np.zeros(shape, dtype=np.float32)
        self.n_ctx = n_ctx
        self.n_slots = n_slots

    def write(self, layer: int, slot: int, start: int, k: np.ndarray, v: np.ndarray) -> None:
        """k, v: (Hkv, T, Dh) for positions start .. start + T."""
        T = k.shape[1]
        self.k[layer, slot, :, start : start + T] = k
        self.v[layer, slot, :, start : start + T] = v

    def view(self, layer: int, slot: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """Keys and values for positions 0 .. end: (Hkv, end, Dh) each, no copy."""
        return self.k[layer, slot, :, :end], self.v[layer, slot, :, :end]

    def bytes_per_token(self) -> int:
        n_layer, _, n_kv_head, _, head_dim = self.k.shape
        return 2 * n_layer * n_kv_head * head_dim * 4
