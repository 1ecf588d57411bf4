"""A session's parked conversation: the token history whose KV is held, and that KV.

Parked lazily where the KV cache allows it (`host_readable`, the host-memory KVCache of
the CPU and numpy backends): a finished turn's conversation keeps referring to its slot,
whose pages still hold the KV, instead of copying it out at once, so a kept session's KV
exists once, not twice. It moves to host memory (`move_out`) only when the engine thread
is about to overwrite the slot or hand its pages back (slot_cache.py calls it wherever a
kept slot stops keeping). A reader on another thread (the disk writer, an export) takes a
copy it does not keep (`arrays`). Every copy from the slot runs under the conversation's
own lock and the engine thread takes that lock before it reuses the slot, so a reader
never sees a half-overwritten slot.
Other KV caches (device memory: CuPy, dies) are copied out at once, as before.

`nbytes` is the KV's size wherever it lives (what /admin/stats and the metrics report);
`host_bytes` is what is held in host memory apart from the slots (0 while lazy).
Immutable once parked: a turn replaces a conversation, never edits it.
"""

from __future__ import annotations

import threading

import numpy as np


class Conversation:
    def __init__(self, tokens, k: np.ndarray, v: np.ndarray):
        self.tokens: tuple[int, ...] = tuple(tokens)
        self._k, self._v = k, v  # (n_layer, n_kv_head, n_tok, head_dim) each, once copied
        self._kv = None  # the KV cache whose slot `_slot` holds this KV (lazy only)
        self._slot: int | None = None
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
        conv._kv, conv._slot = kv, slot
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
        k, v = self._k, self._v
        return int(k.nbytes + v.nbytes) if k is not None else 0

    @property
    def resident_slot(self) -> int | None:
        """The slot still holding this KV, None once copied out. Engine thread only: only
        it moves a conversation out of its slot without being asked."""
        return self._slot

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
            return self._kv.save(self._slot, self.n_tok)

    def move_out(self) -> None:
        """Copy the KV out of its slot into host memory, once (any thread). The engine
        thread calls it before it writes or releases the slot; the lock makes a reader's
        copy finish first."""
        if self._slot is None:
            return
        with self._lock:
            if self._slot is None:
                return
            k, v = self._kv.save(self._slot, self.n_tok)
            self._k, self._v = k, v
            self._kv, self._slot = None, None
