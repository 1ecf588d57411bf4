"""Pieces every architecture file shares: prepared-tensor loading, and attention."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from kernels import numpy_backend as ops
from kernels.kv_cache import KVCache

from ..loading.gguf_file import GGUFFile
from ..loading.weight_cache import WeightCache
from ..types import ModelLoadError


class DecoderWeights:
    """What every decoder model shares around its weights: `tok_embd`, `output` (maybe the
    same array, tied), `output_norm`, `layers` of array fields, and `hp` with n_layer,
    n_kv_head and head_dim."""

    @property
    def weight_bytes(self) -> int:
        arrays = [self.tok_embd, self.output_norm]
        if self.output is not self.tok_embd:
            arrays.append(self.output)
        for layer in self.layers:
            arrays += [a for a in vars(layer).values() if isinstance(a, np.ndarray)]
        return int(sum(a.nbytes for a in arrays))

    def make_kv_cache(self, n_slots: int, n_ctx: int) -> KVCache:
        hp = self.hp
        return KVCache(hp.n_layer, n_slots, hp.n_kv_head, n_ctx, hp.head_dim)


class TensorSource:
    """Where an architecture gets its prepared float32 tensors: dequantised from the GGUF,
    or memory-mapped from the weight cache when a valid entry exists. Fused matrices are
    cached whole, so a cached load never dequantises anything."""

    def __init__(
        self,
        gf: GGUFFile,
        progress: Callable[[int, int], None] | None = None,
        cache: WeightCache | None = None,
    ):
        self.gf = gf
        self.progress = progress
        self.cache = cache
        self.total = len(gf.tensors)
        self.done = 0

    def _advance(self, n: int) -> None:
        self.done += n
        if self.progress is not None:
            self.progress(min(self.done, self.total), self.total)

    def _read(self, name: str) -> np.ndarray:
        if not self.gf.has_tensor(name):
            raise ModelLoadError(f"tensor {name!r} missing from {self.gf.path.name}")
        return self.gf.load_f32(name)

    def _prepared(self, key: str, build: Callable[[], np.ndarray], n: int) -> np.ndarray:
        array = build() if self.cache is None else self.cache.get(key, build)
        self._advance(n)
        return array

    def get(self, name: str, optional: bool = False) -> np.ndarray | None:
        """One tensor; None for a missing optional one."""
        if optional and not self.gf.has_tensor(name):
            return None
        return self._prepared(name, lambda: self._read(name), 1)

    def fused(self, names: list[str]) -> np.ndarray:
        """Several (out, in) matrices stacked along `out`, e.g. q, k and v: one matmul."""
        return self._prepared(
            "+".join(names), lambda: np.concatenate([self._read(n) for n in names]), len(names)
        )

    def fused_bias(self, names: list[str], weights: list[str]) -> np.ndarray | None:
        """Biases matching `fused(weights)`: zeros where one is absent, None when all are."""
        present = [n for n in names if self.gf.has_tensor(n)]
        if not present:
            return None

        def build() -> np.ndarray:
            rows = [int(self.gf.tensors[w].shape[1]) for w in weights]  # GGUF ne[1] = out
            return np.concatenate(
                [
                    self._read(n) if self.gf.has_tensor(n) else np.zeros(r, np.float32)
                    for n, r in zip(names, rows, strict=True)
                ]
            )

        return self._prepared("+".join(names), build, len(present))


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
