"""Moving whole pages of memory from one place to another instead of copying them.

Linux's `mremap(MREMAP_MAYMOVE | MREMAP_FIXED | MREMAP_DONTUNMAP)` hands a range's pages
over to another address: only the page tables change, and the old range stays mapped,
empty (it reads as zeros, refilled on write like any untouched page). A kept KV slot that
admission is about to overwrite is spilled to host memory that way (`KVCache.take`): a
3,000-token SmolLM2 slot, 150 MB, moved in ~3 ms where a copy took 65-85 ms of one
admission step while eight streams waited (bench/RESULTS.md, 2026-12-04 sixth session).

Anything this cannot do (another OS, an old kernel, a range that is not whole pages, the
budget below spent) reports False and the caller copies instead.

Each moved range is a mapping of its own in the destination until that is unmapped, and a
process has at most vm.max_map_count of them (65,530 by default; past it every mmap fails,
numpy's included): a session's conversation moved out of a 48-layer, 8-KV-head model's slot
is 768 ranges, and a server may hold many. So moves are counted (two mappings each: the
range and what it splits off) until host_buffers unmaps their destination (`released`),
and refused past a quarter of the limit.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import sys
import threading

PAGE = mmap.PAGESIZE
_MREMAP_MAYMOVE, _MREMAP_FIXED, _MREMAP_DONTUNMAP = 1, 2, 4
_MAP_FAILED = ctypes.c_void_p(-1).value
_MAP_FIXED = 0x10


def _load_libc():
    """(mremap, mmap) from the C library, typed; (None, None) off Linux."""
    if not sys.platform.startswith("linux"):
        return None, None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or None, use_errno=True)
        remap, map_ = libc.mremap, libc.mmap
    except (OSError, AttributeError):
        return None, None
    remap.restype = map_.restype = ctypes.c_void_p
    remap.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_void_p,
    ]
    map_.argtypes = [
        ctypes.c_void_p,
        ctypes.c_size_t,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_int,
        ctypes.c_long,
    ]
    return remap, map_


_mremap, _mmap = _load_libc()


def _works() -> bool:
    """One page moved between two scratch maps: a kernel before 5.7 (no
    MREMAP_DONTUNMAP) or a sandbox that refuses mremap says no here, once."""
    private = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    src, dst = mmap.mmap(-1, PAGE, flags=private), mmap.mmap(-1, PAGE, flags=private)
    src[:4] = b"page"
    views = [ctypes.c_char.from_buffer(m) for m in (src, dst)]
    a, b = (ctypes.addressof(view) for view in views)
    flags = _MREMAP_MAYMOVE | _MREMAP_FIXED | _MREMAP_DONTUNMAP
    moved = _mremap(a, PAGE, PAGE, flags, b) not in (None, _MAP_FAILED)
    works = moved and dst[:4] == b"page" and src[:4] == bytes(4)
    del views  # the exports end before the maps close
    src.close()
    dst.close()
    return works


# Set when moving cannot work here, or once a move fails: copies from then on.
_broken = _mremap is None or not _works()


def _map_limit() -> int:
    try:
        with open("/proc/sys/vm/max_map_count") as f:
            return int(f.read())
    except (OSError, ValueError):
        return 65530


BUDGET = _map_limit() // 4  # mappings that moves may hold at once
_held = 0
_lock = threading.Lock()


def available() -> bool:
    return not _broken


def room(n_moves: int) -> bool:
    """Whether `n_moves` more moves fit the mappings budget now."""
    return not _broken and _held + 2 * n_moves <= BUDGET


def released(n_moves: int) -> None:
    """The destination of `n_moves` moves was unmapped (host_buffers)."""
    global _held
    with _lock:
        _held = max(0, _held - 2 * n_moves)


def move(src: int, dst: int, n_bytes: int) -> bool:
    """Move the pages of [src, src + n_bytes) to [dst, dst + n_bytes) (addresses and
    length page-aligned, both ranges private anonymous memory of this process); whatever
    dst held is replaced, src is left mapped and empty. False: nothing moved, copy."""
    global _broken, _held
    if _broken or n_bytes <= 0 or (src | dst | n_bytes) % PAGE or _held + 2 > BUDGET:
        return False
    flags = _MREMAP_MAYMOVE | _MREMAP_FIXED | _MREMAP_DONTUNMAP
    if _mremap(src, n_bytes, n_bytes, flags, dst) not in (None, _MAP_FAILED):
        with _lock:
            _held += 2
        return True
    _broken = True  # the probe passed, yet this failed (ENOMEM, say): do not ask again
    # A failed MREMAP_FIXED may already have unmapped dst: map fresh pages there again so
    # that the caller's copy has somewhere to go.
    prot = mmap.PROT_READ | mmap.PROT_WRITE
    flags = mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | _MAP_FIXED
    if _mmap(dst, n_bytes, prot, flags, -1, 0) in (None, _MAP_FAILED):
        raise MemoryError("page_moves: could not map the destination again after a failed move")
    return False
