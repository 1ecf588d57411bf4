"""A session's parked conversation: the token history whose KV is held, and that KV.

Parked lazily where the KV cache allows it (`host_readable`, the host-memory KVCache of
the CPU and numpy backends): a finished turn's conversation keeps referring to its slot,
whose pages still hold the KV, instead of copying it out at once, so a kept session's KV
exists once, not twice. It moves to host memory (`move_out`) only when the engine thread
is about to overwrite the slot or hand its pages back (slot_cache.py calls it wherever a
kept slot stops keeping); a turn that continues it in that very slot moves out only the
positions it will overwrite (`keep_prefix`: usually none or one), and the conversation
stays pinned to the slot's prefix, which that turn never writes. A reader on another
thread (the disk writer, an export) takes a copy it does not keep (`arrays`). Every copy
from the slot runs under the conversation's own lock and the engine thread takes that
lock before it reuses the slot, so a reader never sees a half-overwritten slot. Other KV
caches (device memory: CuPy, dies) are copied out at once, as before.

`nbytes` is the KV's size wherever it lives (what /admin/stats and the metrics report);
`host_bytes` is what is held in host memory apart from the slots (0 while lazy).
Immutable once parked: a turn replaces a conversation, never edits it.
"""

from __future__ import annotations

import threading

import numpy as np

from kernels import host_buffers


class Conversation:
    def __init__(self, tokens, k: np.ndarray, v: np.ndarray):
        self.tokens: tuple[int, ...] = tuple(tokens)
        self._k, self._v = k, v  # (n_layer, n_kv_head, n_tok, head_dim) each, once copied
        self._kv = None  # the KV cache whose slot `_slot` holds this KV (lazy only)
        self._slot: int | None = None
        self._in_slot = 0  # positions 0 .. _in_slot live in the slot; the rest in `_tail`
        self._tail: tuple[np.ndarray, np.ndarray] | None = None
        self._nbytes = int(k.nbytes + v.nbytes) if k is not None else 0
        self._lock = threading.Lock()

    @classmethod
    def parked_from(cls, tokens, kv, slot: int) -> Conversation:
        """A finished turn's conversation from `slot` of `kv` (engine thread): left in the
        slot when the cache may be read from another thread, else copied out now."""
        tokens = tuple(tokens)
        if not getattr(kv, "host_readable", False):
            return cls(tokens, *kv.save(slot, len(tokens)))
        conv = cls(tokens, None, None)
        conv._kv, conv._slot, conv._in_slot = kv, slot, len(tokens)
        conv._nbytes = len(tokens) * kv.bytes_per_token()
        return conv

    @property
    def n_tok(self) -> int:
        return len(self.tokens)

    @property
    def nbytes(self) -> int:
        """The KV's bytes, in its slot or in host memory."""
        return self._nbytes

    @property
    def host_bytes(self) -> int:
        """Bytes of host memory this conversation holds apart from the slots."""
        arrays = (self._k, self._v, *(self._tail or ()))
        return sum(int(a.nbytes) for a in arrays if a is not None)

    @property
    def resident_slot(self) -> int | None:
        """The slot still holding (the first `in_slot` positions of) this KV, None once
        copied out. Engine thread only: only it moves a conversation out unasked."""
        return self._slot

    @property
    def in_slot(self) -> int:
        """How many of its first positions live in `resident_slot` (0: none)."""
        return self._in_slot if self._slot is not None else 0

    @property
    def k(self) -> np.ndarray:
        self.move_out()
        return self._k

    @property
    def v(self) -> np.ndarray:
        self.move_out()
        return self._v

    def arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """(k, v) for a reader that only needs them a while (a blob being written): the
        host copy, else a copy of the slot made under the lock and not kept, so reading
        a conversation does not double its memory."""
        if self._slot is None:
            return self._k, self._v
        with self._lock:
            if self._slot is None:
                return self._k, self._v
            k, v = self._copy_locked()
        host_buffers.unkept(k)  # its memory back to the OS once the reader is done
        host_buffers.unkept(v)
        return k, v

    def move_out(self, keep: int | None = None) -> None:
        """Copy the KV out of its slot into host memory, once (any thread). The engine
        thread calls it before it writes or releases the slot; the lock makes a reader's
        copy finish first. `keep` (engine thread, the slot about to be overwritten past
        its first `keep` positions, nothing else reading them): the slot's pages past
        them move into the host copy instead of being copied (KVCache.take)."""
        if self._slot is None:
            return
        with self._lock:
            if self._slot is None:
                return
            self._k, self._v = self._copy_locked(keep)
            self._kv, self._slot, self._tail = None, None, None

    def keep_prefix(self, n: int) -> None:
        """Engine thread: its slot is about to be written from position `n` on (a turn
        that continues this conversation, resuming in its slot): the positions from `n`
        move to host memory, the first `n` stay in the slot (a failed turn, or one that
        parks a different conversation, leaves this one whole)."""
        if self._slot is None or n >= self._in_slot:
            return
        if n <= 0:
            self.move_out()
            return
        with self._lock:
            k, v = self._kv.save(self._slot, self._in_slot, start=n)
            if self._tail is not None:
                k, v = np.concatenate((k, self._tail[0]), 2), np.concatenate((v, self._tail[1]), 2)
            self._tail, self._in_slot = (k, v), n

    def _copy_locked(self, keep: int | None = None) -> tuple[np.ndarray, np.ndarray]:
        if keep is not None and self._tail is None:
            return self._kv.take(self._slot, self._in_slot, keep)
        k, v = self._kv.save(self._slot, self._in_slot)
        if self._tail is not None:
            k, v = np.concatenate((k, self._tail[0]), 2), np.concatenate((v, self._tail[1]), 2)
        return k, v
