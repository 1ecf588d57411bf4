"""TensorSource: where an architecture gets its weights, in the form its backend wants."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
from gguf import GGMLQuantizationType
from gguf.quants import quantize

from kernels.backend import BLOCKS, Backend
from kernels.weights import Weight

from ..types import ModelLoadError
from .gguf_file import GGUFFile
from .progress import DEQUANTISE, MAP, LoadReporter
from .weight_cache import WeightCache

FLOAT_TYPES = {GGMLQuantizationType.F32, GGMLQuantizationType.F16, GGMLQuantizationType.BF16}


class TensorSource:
    """Tensors of one GGUF handed to a backend. A matrix is stored as the backend asks
    (`Backend.storage_for`): the file's blocks as they are, or float32 values —
    dequantised from the GGUF, or memory-mapped from the weight cache when a valid entry
    exists. Fused matrices (q/k/v, gate/up) are cached whole, so a cached load never
    dequantises anything."""

    def __init__(
        self,
        gf: GGUFFile,
        backend: Backend,
        progress: LoadReporter | None = None,
        cache: WeightCache | None = None,
        quantize: bool = False,
    ):
        self.gf = gf
        self.backend = backend
        self.progress = progress
        self.cache = cache
        # Quantised types the backend has no kernel for, dequantised to float32 instead.
        self.fallback: dict[str, int] = {}
        # Float matrices become Q8_0 blocks at load (the `quantize` load option).
        self.quantize = quantize and backend.storage_for(GGMLQuantizationType.Q8_0) == BLOCKS

    def has(self, name: str) -> bool:
        return self.gf.has_tensor(name)

    def _advance(self, names: list[str], phase: str) -> None:
        if self.progress is not None:
            nbytes = sum(self.gf.stored_bytes(n) for n in names)
            self.progress.tensors(len(names), nbytes, phase)

    def _require(self, name: str) -> None:
        if not self.gf.has_tensor(name):
            raise ModelLoadError(f"tensor {name!r} missing from {self.gf.path.name}")

    def _read(self, name: str) -> np.ndarray:
        self._require(name)
        return self.gf.load_f32(name)

    def _prepared(self, key: str, build: Callable[[], np.ndarray], names: list[str]) -> np.ndarray:
        """Float32 values (or Q8_0 blocks) of `names`: from the weight cache (a map) when it
        holds them, else built from the file (dequantised)."""
        if self.cache is None:
            array, phase = build(), DEQUANTISE
        else:
            hits = self.cache.hits
            array = self.cache.get(key, build)
            phase = MAP if self.cache.hits > hits else DEQUANTISE
        self._advance(names, phase)
        return array

    def _f32(self, name: str) -> np.ndarray:
        return self._prepared(name, lambda: self._read(name), [name])

    def vector(self, name: str, optional: bool = False):
        """A norm weight or bias in the backend's memory; None for a missing optional one."""
        if optional and not self.gf.has_tensor(name):
            return None
        return self.backend.vector(self._f32(name))

    def matrix(self, names: str | list[str], optional: bool = False) -> Weight | None:
        """One (out, in) matrix, or several stacked along `out` (q, k and v: one matmul).
        None for a missing optional single matrix."""
        names = [names] if isinstance(names, str) else list(names)
        if optional and not self.gf.has_tensor(names[0]):
            return None
        for name in names:
            self._require(name)
        qtypes = [self.gf.tensor_type(n) for n in names]
        cols = int(self.gf.tensors[names[0]].shape[0])  # GGUF ne[0] = in
        if self.quantize and cols % 32 == 0 and set(qtypes) <= FLOAT_TYPES:
            parts = [self._quantized(name, cols) for name in names]
            return parts[0] if len(parts) == 1 else self.backend.stacked_weight(parts)
        if all(self.backend.storage_for(q) == BLOCKS for q in qtypes):
            # The file's bytes as they are (memory-mapped): loading is a map.
            parts = []
            for name, qtype in zip(names, qtypes, strict=True):
                blocks = self.gf.load_blocks(name)
                parts.append(self.backend.block_weight(blocks, qtype, (len(blocks), cols)))
            self._advance(names, MAP)
            return parts[0] if len(parts) == 1 else self.backend.stacked_weight(parts)
        for qtype in qtypes:
            if qtype != GGMLQuantizationType.F32:
                self.fallback[qtype.name] = self.fallback.get(qtype.name, 0) + 1
        if len(names) == 1:
            return self.backend.dense_weight(self._f32(names[0]))
        fused = self._prepared(
            "+".join(names), lambda: np.concatenate([self._read(n) for n in names]), names
        )
        return self.backend.dense_weight(fused)

    def experts(self, name: str, n_expert: int) -> list[Weight]:
        """A stacked expert tensor (GGUF [in, out, n_expert]) as one (out, in) matrix per
        expert, each over its own rows of the stack: the file's blocks as they are (views
        of the map, no copy) where the backend has a kernel for the type, else float32."""
        self._require(name)
        info = self.gf.tensors[name]
        if len(info.shape) != 3 or int(info.shape[2]) != n_expert:
            raise ModelLoadError(
                f"tensor {name!r} has shape {info.shape}, not [in, out, {n_expert}]"
            )
        cols, rows = int(info.shape[0]), int(info.shape[1])
        qtype = self.gf.tensor_type(name)
        if self.quantize and cols % 32 == 0 and qtype in FLOAT_TYPES:
            q8 = GGMLQuantizationType.Q8_0
            blocks = self._prepared(
                f"{name}@Q8_0", lambda: quantize(self._read(name).reshape(-1, cols), q8), [name]
            )
            qtype = q8
        elif self.backend.storage_for(qtype) == BLOCKS:
            blocks = self.gf.load_blocks(name)  # (n_expert * out, bytes per row)
            self._advance([name], MAP)
        else:
            if qtype != GGMLQuantizationType.F32:
                self.fallback[qtype.name] = self.fallback.get(qtype.name, 0) + 1
            values = self._prepared(name, lambda: self._read(name).reshape(-1, cols), [name])
            return [
                self.backend.dense_weight(values[e * rows : (e + 1) * rows])
                for e in range(n_expert)
            ]
        blocks = np.asarray(blocks)
        return [
            self.backend.block_weight(blocks[e * rows : (e + 1) * rows], qtype, (rows, cols))
            for e in range(n_expert)
        ]

    def expert_biases(self, names: list[str], n_expert: int) -> list | None:
        """Biases of stacked expert tensors (GGUF [out, n_expert] each) as one vector per
        expert, the names' rows one after another (gate then up: matching a fused gate/up
        product); None when the file has none of them."""
        present = [n for n in names if self.gf.has_tensor(n)]
        if not present:
            return None
        if len(present) != len(names):
            raise ModelLoadError(f"expert biases: {sorted(set(names) - set(present))} missing")
        stacks = [self._f32(n).reshape(n_expert, -1) for n in names]
        return [
            self.backend.vector(np.concatenate([s[e] for s in stacks])) for e in range(n_expert)
        ]

    def _quantized(self, name: str, cols: int) -> Weight:
        """A float matrix as Q8_0 blocks (a quarter of float32's bytes, near-lossless)."""
        q8 = GGMLQuantizationType.Q8_0
        blocks = self._prepared(f"{name}@Q8_0", lambda: quantize(self._read(name), q8), [name])
        return self.backend.block_weight(np.asarray(blocks), q8, (len(blocks), cols))

    def fused_bias(self, names: list[str], weights: list[str]):
        """Biases matching `matrix(weights)`: zeros where one is absent, None when all are."""
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

        return self.backend.vector(self._prepared("+".join(names), build, present))
