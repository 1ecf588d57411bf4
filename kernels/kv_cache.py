"""Preallocated per-slot KV cache, written by index.

The arrays live in one anonymous memory map: pages are committed only as they are
written, so a large window costs memory only as it fills, and `release(slot)` hands a
freed slot's pages back to the OS (a slot once filled to 8k tokens would otherwise hold
its ~380 MB for good), which is what lets the memory ladder actually relieve pressure.

The rows are kept in the model's KV type (kernels/kv_types.py: float32, float16 or Q8_0
blocks): `write` encodes, `view` gives float32 values back (a copy for the narrow types:
the numpy reference's attention reads that; the compiled kernels read the stored rows),
and everything that moves KV whole (`save`, `load`, `copy_prefix`: parked conversations,
session blobs) moves the stored rows as they are.
"""

from __future__ import annotations

import math
import mmap

import numpy as np

from kernels import kv_types, page_moves
from kernels.host_buffers import host_copy, host_empty, note_moves

# A (layer, head) run shorter than this past `keep` is copied by `take`, not moved: each
# move is a system call and a mapping of its own (vm.max_map_count), worth it for runs
# of many pages only (SmolLM2 in float32: 256 positions).
MIN_MOVE_BYTES = 1 << 16


class KVCache:
    # `save` may run on any thread while the engine thread writes other slots (plain host
    # memory, no device stream): a session's conversation may stay in its slot until it
    # must move out (engine/serving/conversation.py).
    host_readable = True

    def __init__(
        self,
        n_layer: int,
        n_slots: int,
        n_kv_head: int,
        n_ctx: int,
        head_dim: int,
        dtype: np.dtype | type = np.float32,
        kv_dtype: str = kv_types.DEFAULT_KV_DTYPE,
    ):
        self.kv_dtype = kv_types.check_kv_dtype(kv_dtype)
        problem = kv_types.fits(kv_dtype, head_dim)
        if problem:
            raise ValueError(problem)
        self.head_dim = head_dim
        self.dtype, row = kv_types.storage(kv_dtype, head_dim, dtype)  # the stored elements
        shape = (n_layer, n_slots, n_kv_head, n_ctx, row)
        n_items = int(np.prod(shape))
        n_bytes = n_items * self.dtype.itemsize
        # Private, so that MADV_DONTNEED really frees (a shared anonymous map keeps the data).
        flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
        self._maps = [mmap.mmap(-1, max(n_bytes, 1), flags=flags) for _ in range(2)]
        self.k, self.v = (
            np.frombuffer(m, dtype=self.dtype, count=n_items).reshape(shape) for m in self._maps
        )
        self.n_ctx = n_ctx
        self.n_slots = n_slots
        self._high_water = [0] * n_slots  # positions written per slot since its release

    def write(self, layer: int, slot: int, start: int, k: np.ndarray, v: np.ndarray) -> None:
        """k, v: (Hkv, T, Dh) for positions start .. start + T."""
        T = k.shape[1]
        self.k[layer, slot, :, start : start + T] = kv_types.encode(np, k, self.kv_dtype)
        self.v[layer, slot, :, start : start + T] = kv_types.encode(np, v, self.kv_dtype)
        if start + T > self._high_water[slot]:
            self._high_water[slot] = start + T

    def note_written(self, slots, ends) -> None:
        """A kernel wrote positions up to `ends[i]` of `slots[i]` itself (compiled decode
        attention): keep the per-slot high-water marks that `release` relies on."""
        for slot, end in zip(slots, ends, strict=True):
            if end > self._high_water[slot]:
                self._high_water[slot] = int(end)

    def view(self, layer: int, slot: int, end: int) -> tuple[np.ndarray, np.ndarray]:
        """Keys and values for positions 0 .. end: (Hkv, end, Dh) each, as float32 values
        (no copy for f32; one slot's and layer's rows decoded for f16 and q8_0)."""
        k, v = self.k[layer, slot, :, :end], self.v[layer, slot, :, :end]
        return kv_types.decode(np, k, self.kv_dtype), kv_types.decode(np, v, self.kv_dtype)

    def copy_prefix(self, src: int, dst: int, n: int) -> None:
        """Positions 0 .. n of slot `src` into slot `dst` (a shared prompt, n > 1)."""
        self.k[:, dst, :, :n] = self.k[:, src, :, :n]
        self.v[:, dst, :, :n] = self.v[:, src, :, :n]
        self._high_water[dst] = max(self._high_water[dst], n)

    def load(self, slot: int, k: np.ndarray, v: np.ndarray, n: int) -> None:
        """Positions 0 .. n of parked KV (n_layer, n_kv_head, >= n, head_dim) into `slot`
        (a session's turn resuming from its cached prefix)."""
        self.k[:, slot, :, :n] = k[:, :, :n]
        self.v[:, slot, :, :n] = v[:, :, :n]
        self._high_water[slot] = max(self._high_water[slot], n)

    def save(self, slot: int, n: int, start: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """Copies of positions start .. n of `slot` as stored: (n_layer, n_kv_head, n - start,
        row) each (row = head_dim values for f32 and f16, head_dim / 32 Q8_0 blocks' bytes)."""
        # Not np.ascontiguousarray: host_buffers.py says why (a ~400 ms stall per 188 MB).
        return (
            host_copy(self.k[:, slot, :, start:n]),
            host_copy(self.v[:, slot, :, start:n]),
        )

    def take(self, slot: int, n: int, keep: int = 0) -> tuple[np.ndarray, np.ndarray]:
        """What `save(slot, n)` returns, for a slot about to be overwritten: the whole pages
        of positions `keep` .. n move into the copy instead of being copied
        (page_moves.py), so afterwards those positions of the slot read as zeros. The
        first `keep` positions stay (a prompt reusing them in place, a copy still to
        read them). A plain copy where pages cannot move."""
        n_layer, _, n_kv_head, n_ctx, row_items = self.k.shape
        row = row_items * self.dtype.itemsize
        keep = min(keep, n)
        if (
            (n_ctx * row) % page_moves.PAGE
            or (n - keep) * row < MIN_MOVE_BYTES
            or not page_moves.room(2 * n_layer * n_kv_head)  # False where pages cannot move
        ):
            return self.save(slot, n)
        # Each (layer, head) run of the copy starts on a page, as the slot's runs do.
        unit = page_moves.PAGE // math.gcd(row, page_moves.PAGE)  # positions per page run
        n_pad = -(-n // unit) * unit
        begin = -(-keep * row // page_moves.PAGE) * page_moves.PAGE
        end = n * row // page_moves.PAGE * page_moves.PAGE
        out = []
        for stored in (self.k, self.v):
            copy = host_empty(
                (n_layer, n_kv_head, n_pad, row_items), self.dtype, pages_moved_in=True
            )
            src_bytes = stored.view(np.uint8).reshape(n_layer, self.n_slots, n_kv_head, -1)
            dst_bytes = copy.view(np.uint8).reshape(n_layer, n_kv_head, -1)
            moves = 0
            for layer in range(n_layer):
                for head in range(n_kv_head):
                    src, dst = src_bytes[layer, slot, head], dst_bytes[layer, head]
                    moved = end > begin and page_moves.move(
                        src.ctypes.data + begin, dst.ctypes.data + begin, end - begin
                    )
                    if moved:  # the partial pages at either end are copied
                        moves += 1
                        dst[:begin] = src[:begin]
                        dst[end : n * row] = src[end : n * row]
                    else:
                        dst[: n * row] = src[: n * row]
            note_moves(copy, moves)
            out.append(copy[:, :, :n])
        return out[0], out[1]

    @property
    def layout(self) -> tuple[int, int, int]:
        """(n_layer, n_kv_head, head_dim): what a parked conversation's arrays must match."""
        n_layer, _, n_kv_head, _, _ = self.k.shape
        return n_layer, n_kv_head, self.head_dim

    def release(self, slot: int, keep: int = 0) -> int:
        """Give a free slot's written pages back to the OS, all but the first `keep`
        positions (what the prefix cache keeps: a longer conversation written there
        before is dead weight past them); returns the bytes released.

        Only whole pages inside the slot are dropped (they read as zeros afterwards), so
        neighbouring slots and the kept positions are never touched. The caller guarantees
        the slot is free.
        """
        written = self._high_water[slot]
        if written <= keep:
            return 0
        self._high_water[slot] = keep
        n_layer, _, n_kv_head, n_ctx, row_items = self.k.shape
        row = row_items * self.dtype.itemsize  # bytes per position
        slot_bytes = n_kv_head * n_ctx * row
        page = mmap.PAGESIZE
        released = 0
        for m in self._maps:
            for layer in range(n_layer):
                for head in range(n_kv_head):
                    first = (layer * self.n_slots + slot) * slot_bytes + head * n_ctx * row
                    begin = -(-(first + keep * row) // page) * page
                    end = (first + written * row) // page * page
                    if end > begin:
                        m.madvise(mmap.MADV_DONTNEED, begin, end - begin)
                        released += end - begin
        return released

    def bytes_per_token(self) -> int:
        n_layer, _, n_kv_head, _, row_items = self.k.shape
        return 2 * n_layer * n_kv_head * row_items * self.dtype.itemsize

    @property
    def nbytes(self) -> int:
        return self.k.nbytes + self.v.nbytes
