"""The GPU backend's logic as array code over a module `xp` (issue 16).

On a GPU `xp` is CuPy: weights go to the device in their GGUF block layout (device memory
about the file's size), the KV cache lives there, and only logits come back. Everything
here is written against numpy's API so the suite runs it with xp = numpy against the
numpy reference (tests/engine/models/test_xp_backend.py); the CUDA C kernels that will replace
the slow steps (a dequantising mat-vec instead of dequantise-then-matmul, flash-decode
attention, fused norms) get these functions as their twins.

Never served on a GPU: a CUDA die computes with kernels/cuda/backend.py (CudaBackend);
this is its twin, bench_gpu's `--backend xp` baseline, and the host dies' backend in the
suite.

Batch invariance, as the seam requires: `linear` multiplies each row of x alone (a stack
of row vectors, one product each) against fixed chunks of weight rows, so on numpy a row's
result never depends on the batch; `attention_decode` runs each row over its own slot. On
CuPy that matmul becomes one cuBLAS GEMM whose kernel depends on B: rows agree within
1e-4, not bitwise (seen on an H200; tests/gpu/test_xp_on_cupy.py).
"""

from __future__ import annotations

import numpy as np
from gguf import GGMLQuantizationType

from kernels import kv_types
from kernels.backend import BLOCKS, DENSE
from kernels.reference.backend import (
    NumpyBackend,
    apply_rope_interleaved,
    apply_rope_neox,
    chunk_ranges,
    rope_tables,
)
from kernels.weights import RopeTable, Weight, parts_of, stack_parts
from kernels.xp import quants as xp_quants


def to_numpy(xp, a) -> np.ndarray:
    """A host copy (numpy: the array itself)."""
    return a if xp is np else xp.asnumpy(a)


class XpKVCache:
    """Per-slot keys and values (n_layer, n_slots, Hkv, n_ctx, row) in xp's memory, stored
    as `kv_dtype` (kernels/kv_types.py), with kernels.kv_cache.KVCache's interface. Device
    memory is allocated whole at creation (no lazily committed pages, so `release` frees
    nothing: the memory ladder counts it all from the start)."""

    def __init__(
        self,
        xp,
        n_layer,
        n_slots,
        n_kv_head,
        n_ctx,
        head_dim,
        dtype=np.float32,
        spare=0,
        kv_dtype=kv_types.DEFAULT_KV_DTYPE,
    ):
        # `spare` slots beyond n_slots are no sequence's: a captured decode step's padding
        # rows write there (scratch_slot), so they change nothing anyone reads.
        self.kv_dtype = kv_types.check_kv_dtype(kv_dtype)
        problem = kv_types.fits(kv_dtype, head_dim)
        if problem:
            raise ValueError(problem)
        self.head_dim = head_dim
        self.dtype, row = kv_types.storage(kv_dtype, head_dim, dtype)
        shape = (n_layer, n_slots + spare, n_kv_head, n_ctx, row)
        self.scratch_slot = n_slots if spare else None
        self.xp = xp
        self.k = xp.zeros(shape, dtype=self.dtype)
        self.v = xp.zeros(shape, dtype=self.dtype)
        self.n_ctx = n_ctx
        self.n_slots = n_slots

    def write(self, layer, slot, start, k, v) -> None:
        """k, v: (Hkv, T, Dh) for positions start .. start + T."""
        T = k.shape[1]
        self.k[layer, slot, :, start : start + T] = kv_types.encode(self.xp, k, self.kv_dtype)
        self.v[layer, slot, :, start : start + T] = kv_types.encode(self.xp, v, self.kv_dtype)

    def note_written(self, slots, ends) -> None:
        """Nothing to track: `release` has no pages to hand back."""

    def view(self, layer, slot, end):
        """float32 keys and values (Hkv, end, Dh) of one slot and layer (decoded for the
        narrow types)."""
        k, v = self.k[layer, slot, :, :end], self.v[layer, slot, :, :end]
        xp, kv_dtype = self.xp, self.kv_dtype
        return kv_types.decode(xp, k, kv_dtype), kv_types.decode(xp, v, kv_dtype)

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        self.k[:, dst, :, :n] = self.k[:, src, :, :n]
        self.v[:, dst, :, :n] = self.v[:, src, :, :n]

    def load(self, slot: int, k: np.ndarray, v: np.ndarray, n: int) -> None:
        """Parked KV from the host (n_layer, Hkv, >= n, row) into `slot`'s positions 0 .. n."""
        self.k[:, slot, :, :n] = self.xp.asarray(k[:, :, :n])
        self.v[:, slot, :, :n] = self.xp.asarray(v[:, :, :n])

    def take(self, slot: int, n: int, keep: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """`save`: pages of device memory cannot move to the host (kv_cache.KVCache.take)."""
        return self.save(slot, n)

    def save(self, slot: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        """Host copies of `slot`'s positions 0 .. n as stored: (n_layer, Hkv, n, row) each."""
        k = self.xp.ascontiguousarray(self.k[:, slot, :, :n])
        v = self.xp.ascontiguousarray(self.v[:, slot, :, :n])
        return np.array(to_numpy(self.xp, k)), np.array(to_numpy(self.xp, v))

    @property
    def layout(self) -> tuple[int, int, int]:
        n_layer, _, n_kv_head, _, _ = self.k.shape
        return n_layer, n_kv_head, self.head_dim

    def release(self, slot: int, keep: int = 0) -> int:
        return 0

    def bytes_per_token(self) -> int:
        n_layer, _, n_kv_head, _, row = self.k.shape
        return 2 * n_layer * n_kv_head * row * self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return int(self.k.nbytes + self.v.nbytes)


class XpBackend(NumpyBackend):
    """Matrices in GGUF blocks on xp's device, dequantised a fixed chunk of rows at a time
    and multiplied there; norms, activations and attention are the numpy reference's
    (inherited: they take their array module from their input), on xp's arrays."""

    name = "xp"
    dtype = np.dtype(np.float32)
    # Attention reads the KV cache where it lives, in xp's memory (the die's): never the
    # host-softmax fallback the contract's `attention` object reports (None: on the die).
    host_attention_reason = None

    def __init__(self, xp=np):
        self.xp = xp
        self.on_accelerator = xp is not np

    # ---- weights ----

    def storage_for(self, qtype: GGMLQuantizationType) -> str:
        return BLOCKS if xp_quants.supports(qtype) else DENSE

    def dense_weight(self, array: np.ndarray) -> Weight:
        array = self.xp.asarray(np.ascontiguousarray(array, dtype=np.float32))
        n, k = array.shape
        return Weight("f32", (n, k), array, {"chunks": chunk_ranges(n, k, 4)})

    def block_weight(self, blocks, qtype, shape) -> Weight:
        n, k = int(shape[0]), int(shape[1])
        data = self.xp.asarray(np.ascontiguousarray(blocks))
        meta = {"qtype": qtype, "chunks": chunk_ranges(n, k, 4)}
        return Weight(qtype.name, (n, k), data, meta)

    def stacked_weight(self, parts: list[Weight]) -> Weight:
        """Stacked matrices (q/k/v, gate/up; of one block type or of several, as Q5_0,
        Q5_0, Q8_0) as parts, each kept as it was made, never copied."""
        return stack_parts(parts)

    def vector(self, array: np.ndarray):
        return self.xp.asarray(np.ascontiguousarray(array, dtype=np.float32))

    _parts = staticmethod(parts_of)

    def _values(self, w: Weight, begin: int = 0, end: int | None = None):
        """Rows begin .. end of a (non-stacked) matrix as float32 on the device."""
        if not w.is_blocks:
            return w.data[begin:end]
        return xp_quants.dequantize(self.xp, w.data[begin:end], w.meta["qtype"])

    # ---- ops ----

    def _ids(self, values):
        """Index values (token ids, positions) as xp's array: host ones uploaded, xp's own
        (a captured graph's input buffers) used as they are, never read back."""
        if isinstance(values, self.xp.ndarray):
            return values
        return self.xp.asarray(np.asarray(values, dtype=np.int64))

    def embed(self, table: Weight, token_ids: np.ndarray):
        ids = self._ids(token_ids)
        if not table.is_blocks:
            return table.data[ids]
        return xp_quants.dequantize(self.xp, table.data[ids], table.meta["qtype"])

    def linear(self, x, w: Weight):
        xp = self.xp
        B = x.shape[0]
        out = xp.empty((B, 1, w.shape[0]), dtype=np.float32)
        rows = x[:, None, :]  # (B, 1, K): one row-vector product per row of x
        for col0, part in self._parts(w):
            for begin, end in part.meta["chunks"]:
                values = self._values(part, begin, end)
                out[:, :, col0 + begin : col0 + end] = xp.matmul(rows, values.T)
        return out[:, 0]

    def linear_prefill(self, x, w: Weight):
        parts = [x @ self._values(part).T for _, part in self._parts(w)]
        return parts[0] if len(parts) == 1 else self.xp.concatenate(parts, axis=1)

    def rope_table(self, n_pos, dim, base, factors=None, attn_factor=1.0) -> RopeTable:
        cos, sin = rope_tables(n_pos, dim, base, factors, attn_factor)
        return RopeTable(self.xp.asarray(cos), self.xp.asarray(sin))

    def rope(self, x, positions, table: RopeTable, neox: bool):
        pos = self._ids(positions)
        cos, sin = table.cos[pos], table.sin[pos]
        return apply_rope_neox(x, cos, sin) if neox else apply_rope_interleaved(x, cos, sin)

    # ---- the device KV cache (attention: the reference's, on these arrays) ----

    def make_kv_cache(
        self, n_layer, n_slots, n_kv_head, n_ctx, head_dim, kv_dtype="f32"
    ) -> XpKVCache:
        spare = 1 if self.captures_graphs else 0
        shape = (n_layer, n_slots, n_kv_head, n_ctx, head_dim)
        return XpKVCache(self.xp, *shape, self.dtype, spare, kv_dtype)

    def to_host(self, x) -> np.ndarray:
        return to_numpy(self.xp, x)

    def capture_step(self, step, bucket: int, width: int | None, scratch_slot: int):
        """kernels/cuda/graphs.py: a CUDA graph on CuPy; on numpy the same buffers and
        padding with no graph (a subclass that sets captures_graphs runs it in the suite)."""
        from kernels.cuda.graphs import capture_decode

        return capture_decode(self.xp, step, bucket, width, scratch_slot)

    def adopt(self, x):
        """Hidden states from another die's stage: copied onto the current device (CuPy's
        copy() lands there, from any device); numpy's arrays are already here."""
        if self.xp is np:
            return x
        if isinstance(x, np.ndarray):
            return self.xp.asarray(x)
        return x if x.device.id == self.xp.cuda.Device().id else x.copy()
