"""The engine process's CPU threads and heap: set once, deliberately.

- BLAS threads. OpenBLAS starts one thread per core and its threads meet at a barrier in
  every GEMM/GEMV; when another process keeps one core busy, each barrier waits for a
  preempted thread and a 0.5 s request takes 4-6 s (issue 18; bench/bench_threads.py
  measures it). `configure(threads)` limits every BLAS library loaded in the process
  (threadpoolctl) to one pool of `threads`, shared by all loaded models; 0 picks
  `default_threads()`.
- Arenas. glibc gives each thread that contends for the heap its own arena (up to 8 per
  core), and memory freed in one arena is never reused by another: `configure` caps them
  (M_ARENA_MAX) before the server's threads start.
- Large blocks. glibc serves a block past its mmap threshold with its own mapping, given
  back on free, but raises that threshold to the size of each such block freed (up to
  32 MB): after the first big temporary, every activation, KV copy and request body of
  under that size lands in the heap, interleaved with small live objects, and a busy
  server (never idle, so never trimmed) keeps the freed pages. `configure` fixes the
  threshold at MMAP_THRESHOLD: in a 7-minute cluster soak its instances sat 30-50 MB
  lower and swung less (bench/RESULTS.md, "Heap"); the cost is a page fault per 4 KB of
  each big temporary, which is not noise for what every decode step makes again: the
  compiled step keeps its buffers per thread (kernels/cpu/scratch.c) and the logits go
  on reused pages (kernels/host_buffers.py); tests/kernels/cpu/test_step_memory.py.
- Prefill passes. A prompt chunk's forward makes temporaries of megabytes per op, again
  in every op of every layer: past the fixed threshold each was a fresh mapping, faulted
  in and zeroed page by page, then unmapped (~0.4 s of the 1.44 s SmolLM2 took for a
  730-token prompt over HTTP). While a prefill pass runs (`prefill_heap`: a prompt's or
  a job's, on the engine thread) the threshold is PREFILL_MMAP_THRESHOLD and the heap's
  freed top is kept (up to PREFILL_TRIM_THRESHOLD), so the pass's ops reuse heap pages;
  after it both go back, and glibc hands the freed top back to the OS at the next free.
- Trim. Freed heap pages stay with the process; `trim()` (malloc_trim(0)) hands them back,
  and the free maps of host KV copies (kernels/host_buffers.py) with them.
  The engine calls it when it goes idle after work (never on the decode path).
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import logging
import os
import threading
import time
from collections.abc import Iterator

from kernels import host_buffers

log = logging.getLogger("pantheon.engine")

M_ARENA_MAX = -8  # glibc malloc.h
M_MMAP_THRESHOLD = -3
M_TRIM_THRESHOLD = -1
ARENA_MAX = 2
MMAP_THRESHOLD = 256 * 1024  # a decode step's logits (49k vocab x 4 B) stay in the heap
TRIM_THRESHOLD = 128 * 1024  # glibc's default, fixed with the mmap threshold
PREFILL_MMAP_THRESHOLD = 16 << 20  # while a prefill pass runs (prefill_heap)
PREFILL_TRIM_THRESHOLD = 16 << 20  # freed heap top kept meanwhile (enough for a 256-token pass)
TRIM_EVERY_S = 5.0  # at most one trim per this many seconds (per process)

_lock = threading.Lock()
_state: dict = {"threads": None, "limiter": None, "last_trim": 0.0, "tuned": False, "prefills": 0}


def usable_cores() -> int:
    """The cores this process may run on (its affinity mask), else the machine's."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return max(1, os.cpu_count() or 1)


def default_threads() -> int:
    """One BLAS thread per usable core but one, which is left to the event loop, the
    request threads and the neighbours: a BLAS barrier is only as fast as its slowest
    thread, and a thread that shares its core with anything busy makes every matmul
    wait (bench/RESULTS.md, "BLAS threads under a busy neighbour")."""
    return max(1, usable_cores() - 1)


def configure(threads: int = 0) -> int:
    """Limit BLAS to `threads` (0: default_threads()) and cap malloc arenas; returns the
    thread count. Idempotent; a later call with another count changes the limit."""
    n = threads if threads > 0 else default_threads()
    # The compiled kernels' pool hands out work from a counter, so a thread whose core a
    # neighbour holds delays nothing (kernels/cpu/pool.h): by default it takes every core.
    kernel_n = threads if threads > 0 else usable_cores()
    with _lock:
        if _state["threads"] == n and _state.get("kernel_threads") == kernel_n:
            return n
        if _state["threads"] != n:
            _tune_heap()
            try:
                from threadpoolctl import threadpool_limits

                # Not as a context manager: the limit holds for the process from now on.
                _state["limiter"] = threadpool_limits(limits=n, user_api="blas")
            except Exception:  # no threadpoolctl or an unknown BLAS: say so, keep serving
                log.warning("BLAS threads could not be limited to %d", n, exc_info=True)
            _state["threads"] = n
        _state["kernel_threads"] = kernel_n
    _set_kernel_threads(kernel_n)
    log.info(
        "engine CPU threads: compiled kernels %d, BLAS limited to %d (of %d usable cores)",
        kernel_n,
        n,
        usable_cores(),
    )
    return n


def configured() -> int:
    """The BLAS thread count `configure` set (default_threads() before any call)."""
    return _state["threads"] or default_threads()


def kernel_threads() -> int:
    """The compiled kernels' pool size `configure` set (every usable core by default)."""
    return _state.get("kernel_threads") or usable_cores()


def _set_kernel_threads(n: int) -> None:
    """Size the compiled kernels' pool (kernels._cpu, when built)."""
    try:
        from kernels import _cpu
    except ImportError:
        return
    _cpu.set_threads(n)


def blas_threads() -> list[int]:
    """The thread counts the loaded BLAS libraries use now (for tests and benches)."""
    from threadpoolctl import threadpool_info

    return [pool["num_threads"] for pool in threadpool_info() if pool["user_api"] == "blas"]


def _libc():
    if not hasattr(_libc, "lib"):
        name = ctypes.util.find_library("c")
        try:
            lib = ctypes.CDLL(name) if name else None
            if lib is not None and not hasattr(lib, "malloc_trim"):
                lib = None  # not glibc (musl, macOS): nothing to tune
        except OSError:
            lib = None
        _libc.lib = lib
    return _libc.lib


def _tune_heap() -> None:
    """Cap the arenas and fix the mmap threshold (the module's docstring says why)."""
    lib = _libc()
    if lib is not None and hasattr(lib, "mallopt"):
        lib.mallopt(M_ARENA_MAX, ARENA_MAX)
        lib.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
        _state["tuned"] = True


@contextlib.contextmanager
def prefill_heap() -> Iterator[None]:
    """While a prefill pass runs, its big temporaries reuse heap pages (the module's
    docstring); nested and concurrent passes (several models) share one raise. Nothing
    where `configure` did not tune the heap (glibc's own moving threshold is in force)."""
    lib = _libc()
    if lib is None or not _state["tuned"]:
        yield
        return
    with _lock:
        _state["prefills"] += 1
        if _state["prefills"] == 1:
            lib.mallopt(M_MMAP_THRESHOLD, PREFILL_MMAP_THRESHOLD)
            lib.mallopt(M_TRIM_THRESHOLD, PREFILL_TRIM_THRESHOLD)
    try:
        yield
    finally:
        with _lock:
            _state["prefills"] -= 1
            if _state["prefills"] == 0:
                lib.mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)
                lib.mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)


def trim(force: bool = False) -> bool:
    """Hand freed heap pages back to the OS (glibc malloc_trim(0)), at most once per
    TRIM_EVERY_S unless `force`. Returns whether it trimmed."""
    lib = _libc()
    if lib is None:
        host_buffers.trim()
        return False
    now = time.monotonic()
    with _lock:
        if not force and now - _state["last_trim"] < TRIM_EVERY_S:
            return False
        _state["last_trim"] = now
    lib.malloc_trim(0)
    host_buffers.trim()
    return True
