"""Host arrays that are made again and again (KV copies, a decode step's logits) in
memory that is reused.

Two costs of a fresh big array, both measured on this VM (bench/RESULTS.md, 2026-12-04
third session):
- numpy asks for transparent huge pages on every array of 4 MB or more; on a host whose
  THP defrag policy is `madvise` (the common default) its first touch waits for the
  kernel to compact memory, and a long-running server's memory is fragmented: a 188 MB
  slot copied out at admission took ~400 ms, stalling every stream.
- The server fixes glibc's mmap threshold at 256 KB (kernels/devices/threads.py), so an
  array past it is a fresh mapping faulted in page by page: a B = 8 step's 1.5 MB of
  logits, ~400 page faults every step.
So an array of 256 KB or more gets an anonymous map of its own (plain pages), and when
every array on it is gone the map goes to a short free list instead of back to the OS:
the next array of about its size (the next step's logits, the spill that evicted it, the
next conversation moved out) writes pages that are already there. `trim()` (the
engine's idle trim) hands the free list back. A fresh map sends back free maps no
larger than it (`_close_for`): they fit nothing it needed, and held beside it they were
peak RSS for nothing.

How a map's end is seen: numpy makes the flat array read from the map the base of every
view taken of it (and of views of views), so that array dies with the last one; a
weakref callback then files the map (never while any array can still read it:
tests/kernels/test_host_buffers.py).
"""

from __future__ import annotations

import mmap
import threading
import weakref

import numpy as np

from kernels import page_moves

_OWN_MAP_BYTES = 1 << 18  # below this numpy's allocator serves (glibc's heap: threads.py)
_FLAGS = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | getattr(mmap, "MAP_POPULATE", 0)
FREE_MAX_BYTES = 1 << 30  # what the free list may hold between trims
_SLACK = 4  # a free map serves a request of at least 1 / (1 + 1/_SLACK) of its size

# Reentrant: a collection inside a locked section can free a host array, whose callback
# (_give_back) then takes the lock on the same thread.
_lock = threading.RLock()
_free: list[mmap.mmap] = []
_unkept: set[int] = set()  # id() of live maps to close, not file, when their array dies
_moves: dict[int, int] = {}  # id() of maps -> page moves into them (page_moves' budget)


def host_empty(shape: tuple[int, ...], dtype, pages_moved_in: bool = False) -> np.ndarray:
    """An uninitialised C-contiguous array; from 256 KB on a map of its own (a free one
    of about the size when there is one). `pages_moved_in`: most of it will be pages
    moved in from elsewhere (page_moves.py), so always a fresh map of its own, whatever
    its size (never malloc's heap, whose pages a move would replace), its pages not
    faulted in first (they would be zeroed only to be replaced)."""
    dtype = np.dtype(dtype)
    count = int(np.prod(shape, dtype=np.int64))
    n_bytes = count * dtype.itemsize
    if n_bytes < _OWN_MAP_BYTES and not pages_moved_in:
        return np.empty(shape, dtype)
    buffer = None if pages_moved_in else _take(n_bytes)
    if buffer is None:
        _close_for(n_bytes)
        flags = _FLAGS & ~getattr(mmap, "MAP_POPULATE", 0) if pages_moved_in else _FLAGS
        buffer = mmap.mmap(-1, n_bytes, flags=flags)
    flat = np.frombuffer(buffer, dtype=dtype, count=count)
    weakref.finalize(flat, _give_back, buffer).atexit = False
    return flat.reshape(shape)


def host_copy(array: np.ndarray) -> np.ndarray:
    """A C-contiguous copy of `array` (any strides) in host_empty's memory."""
    out = host_empty(array.shape, array.dtype)
    np.copyto(out, array)
    return out


def unkept(array: np.ndarray) -> None:
    """The map under `array` (when host_empty made it) goes back to the OS when its last
    view is gone, not onto the free list: a copy made for a while (a session blob being
    written, conversation.py) is nobody's next array, and on the free list it stayed
    resident until the idle trim (84 MB per 1.9k-token SmolLM2 conversation written)."""
    buffer = _map_of(array)
    if buffer is not None:
        with _lock:
            _unkept.add(id(buffer))


def note_moves(array: np.ndarray, n_moves: int) -> None:
    """`n_moves` page moves landed in the map under `array` (page_moves.py): counted
    against page_moves' mappings budget until the map is unmapped."""
    buffer = _map_of(array)
    if buffer is not None and n_moves:
        with _lock:
            _moves[id(buffer)] = _moves.get(id(buffer), 0) + n_moves


def _map_of(array: np.ndarray) -> mmap.mmap | None:
    base = array
    while isinstance(base, np.ndarray):
        base = base.base
    buffer = base.obj if isinstance(base, memoryview) else base
    return buffer if isinstance(buffer, mmap.mmap) else None


def free_bytes() -> int:
    with _lock:
        return sum(len(m) for m in _free)


def trim() -> int:
    """Unmap the free list; the bytes handed back."""
    with _lock:
        maps, _free[:] = list(_free), []
    return sum(_close(m) for m in maps)


def _take(n_bytes: int) -> mmap.mmap | None:
    """The smallest free map that holds n_bytes without much to spare."""
    with _lock:
        fits = [m for m in _free if n_bytes <= len(m) <= n_bytes + n_bytes // _SLACK]
        if not fits:
            return None
        best = min(fits, key=len)
        _free.remove(best)
    return best


def _close_for(n_bytes: int) -> int:
    """A fresh map of n_bytes is about to be made, none free fitting it: free maps no
    larger than it, oldest first, up to its size, go back to the OS. A spill evicts the
    prefix cache's oldest entries so that its copy writes their pages (slot_cache.py);
    when they are smaller than the copy they fit nothing, and on the free list they were
    held beside the fresh map until the idle trim (perf.py's 8 streams after its
    long-context rep: +100-140 MB of peak RSS). Bytes handed back."""
    with _lock:
        closing, total = [], 0
        for m in _free:
            if total >= n_bytes:
                break
            if len(m) <= n_bytes:
                closing.append(m)
                total += len(m)
        for m in closing:
            _free.remove(m)
    return sum(_close(m) for m in closing)


def _give_back(buffer: mmap.mmap) -> None:
    if buffer.closed:
        return
    with _lock:
        if id(buffer) in _unkept:
            _unkept.discard(id(buffer))
        elif sum(len(m) for m in _free) + len(buffer) <= FREE_MAX_BYTES:
            _free.append(buffer)
            return
    _close(buffer)


def _close(buffer: mmap.mmap) -> int:
    n = len(buffer)
    try:
        buffer.close()
    except BufferError:  # still exported (cannot happen after the view died): left to GC
        return 0
    with _lock:
        moved = _moves.pop(id(buffer), 0)
    page_moves.released(moved)
    return n
