"""The CUDA backend (issue 16): XpBackend on CuPy with its slow steps replaced by the CUDA C
kernels of kernels/cuda/ (launched through kernels.cuda.kernels).

Decode `linear` is the dequantising mat-vec (the file's blocks are read once per step, no
float copy of the matrix), prefill dequantises a fixed chunk of rows at a time and
multiplies with cupy.matmul, RMSNorm / RoPE / GLU / soft-capping are one kernel each, and
decode attention is flash decoding over the device KV cache. What has no kernel is
XpBackend's array code on CuPy: prefill attention, a mat-vec over rows that are not whole
kernel blocks (a float matrix whose width is not a multiple of 32), heads wider than 256.

Batch invariant as the seam requires: the mat-vec and attention kernels compute a row from
its own inputs in a fixed order (kernels/cuda/quant.cu, attention.cu); the others are per
row.

One instance per die: weights, tables and KV caches are allocated on device `die`; the
caller runs the ops with that device (and its stream) current.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
from gguf import GGMLQuantizationType as Q

from kernels.cuda import kernels as cuda_kernels
from kernels.weights import RopeTable, Weight
from kernels.xp import quants as xp_quants
from kernels.xp.backend import XpBackend, XpKVCache


def _import_cupy(die: int):
    """CuPy with device `die` present, or a RuntimeError that says what is missing."""
    try:
        import cupy

        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # ImportError, or a CUDA driver / runtime error
        raise RuntimeError(
            f"the cuda backend needs CuPy and a CUDA device ({type(exc).__name__}: {exc})"
        ) from exc
    if not 0 <= die < count:
        raise RuntimeError(f"the cuda backend was asked for die {die}; CuPy sees {count}")
    return cupy


class CudaBackend(XpBackend):
    name = "cuda"
    # A decode step reads positions, slots and token ids only on the device (the launchers
    # take device arrays), so it can be captured into a CUDA graph (kernels/cuda/graphs.py).
    captures_graphs = True
    # attention.cu reads float32 rows only: a float16 or Q8_0 cache is refused at load
    # (DecoderModel.use_kv_dtype) until its kernels read them.
    kv_dtypes = ("f32",)
    # attention.cu has no sink term in its softmax: a gpt-oss file is refused at load
    # (DecoderModel) rather than computed without its sinks.
    attention_sinks = False

    def __init__(self, die: int = 0):
        cupy = _import_cupy(die)
        super().__init__(cupy)
        self.die = die
        self._device = cupy.cuda.Device(die)

    # ---- what is allocated at load, on this die ----

    def dense_weight(self, array: np.ndarray) -> Weight:
        with self._device:
            return super().dense_weight(array)

    def block_weight(self, blocks, qtype, shape) -> Weight:
        with self._device:
            return super().block_weight(blocks, qtype, shape)

    def vector(self, array: np.ndarray):
        with self._device:
            return super().vector(array)

    def rope_table(self, n_pos, dim, base, factors=None, attn_factor=1.0) -> RopeTable:
        with self._device:
            return super().rope_table(n_pos, dim, base, factors, attn_factor)

    def make_kv_cache(
        self, n_layer, n_slots, n_kv_head, n_ctx, head_dim, kv_dtype="f32"
    ) -> XpKVCache:
        if kv_dtype not in self.kv_dtypes:
            raise ValueError(f"kv_dtype {kv_dtype}: the cuda backend's attention reads f32 only")
        with self._device:
            return super().make_kv_cache(n_layer, n_slots, n_kv_head, n_ctx, head_dim)

    # ---- matrices ----

    @staticmethod
    def _qtype(w: Weight) -> Q:
        """The block type a kernel reads w's data as (a dense matrix: F32 values)."""
        return w.meta["qtype"] if w.is_blocks else Q.F32

    def _values(self, w: Weight, begin: int = 0, end: int | None = None):
        """Rows begin .. end of a (non-stacked) matrix as float32: the dequantise kernel."""
        qtype, k = self._qtype(w), w.shape[1]
        if not w.is_blocks or not cuda_kernels.supports(qtype, k):
            return super()._values(w, begin, end)
        rows = w.data[begin:end]
        return cuda_kernels.dequantize(rows, qtype, rows.shape[0], k)

    def embed(self, table: Weight, token_ids: np.ndarray):
        ids = self._ids(token_ids)
        if not table.is_blocks:
            return table.data[ids]
        qtype, k = table.meta["qtype"], table.shape[1]
        if not cuda_kernels.supports(qtype, k):
            return xp_quants.dequantize(self.xp, table.data[ids], qtype)
        return cuda_kernels.dequantize(table.data[ids], qtype, len(ids), k)

    def linear(self, x, w: Weight):
        """Each part through the mat-vec kernel, written into its columns of one output."""
        x = self.xp.ascontiguousarray(x, dtype=np.float32)
        out = self.xp.empty((x.shape[0], w.shape[0]), dtype=np.float32)
        for col0, part in self._parts(w):
            n, k = part.shape
            qtype, cols = self._qtype(part), out[:, col0 : col0 + n]
            if cuda_kernels.supports(qtype, k):
                cuda_kernels.matvec(x, part.data, qtype, n, k, out=cols)
                continue
            rows = x[:, None, :]  # XpBackend's path: one row-vector product per row of x
            for begin, end in part.meta["chunks"]:
                product = self.xp.matmul(rows, super()._values(part, begin, end).T)
                cols[:, begin:end] = product[:, 0]
        return out

    def linear_prefill(self, x, w: Weight):
        """Dequantised a fixed chunk of rows at a time (a vocabulary-sized matrix never
        whole in float32), each chunk one cupy.matmul."""
        out = self.xp.empty((x.shape[0], w.shape[0]), dtype=np.float32)
        for col0, part in self._parts(w):
            for begin, end in part.meta["chunks"]:
                out[:, col0 + begin : col0 + end] = x @ self._values(part, begin, end).T
        return out

    # ---- per-row ops ----

    def rms_norm(self, x, weight, eps):
        return cuda_kernels.rms_norm(x, weight, eps)

    def rope(self, x, positions, table: RopeTable, neox: bool):
        return cuda_kernels.rope(x, positions, table.cos, table.sin, neox)

    def glu(self, gate_up, d_ff: int, activation: str):
        return cuda_kernels.glu(gate_up, d_ff, activation)

    def softcap(self, x, cap: float):
        return cuda_kernels.softcap(x, cap)

    # ---- attention ----

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
        if sinks is not None:
            raise ValueError("the cuda backend's attention has no sinks")
        if q.shape[2] > cuda_kernels.define("ATT_MAX_HEAD_DIM"):  # past the kernel's shared q
            return super().attention_decode(
                q, k, v, kv, layer, slots, positions, scale, window, softcap
            )
        return cuda_kernels.attention_decode(
            q, k, v, kv.k, kv.v, layer, slots, positions, scale, window, softcap
        )
