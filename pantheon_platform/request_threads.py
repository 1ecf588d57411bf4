"""Kept threads for a request's thread-sensitive calls, instead of one new thread each.

Django's ASGIHandler enters `ThreadSensitiveContext()` per request, so the first
thread-sensitive `sync_to_async` of each request (the `request_started` signal's sync
receivers, at the latest `response.close`) starts a fresh thread, and the event loop
waits in `Thread.start` until the new thread runs. On a host whose cores are busy with
the kernels that wait is milliseconds per request, with the loop stopped: a burst of
eight streamed chats spent ~2.5 ms a request there (py-spy, bench/RESULTS.md
2026-12-04, fourth session). Here each request borrows one of a few long-lived
single-thread executors (asgiref's `ThreadSensitiveContext(executor=...)`), the least
busy, so its sync calls still run one at a time on one thread (Django's database
connections are per thread), and no request ever starts one.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import ThreadSensitiveContext

# Enough that a slow sync view (an operator route's database work) holds up few others;
# each is one idle thread until used.
THREADS = 4


class RequestThreads:
    """Single-thread executors lent one per request, the least busy first (event loop
    thread only, so the counts need no lock)."""

    def __init__(self, n: int = THREADS) -> None:
        self._executors = [
            ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"pantheon-request-{i}")
            for i in range(n)
        ]
        self._lent = [0] * n

    @contextlib.asynccontextmanager
    async def lend(self):
        i = min(range(len(self._lent)), key=self._lent.__getitem__)
        self._lent[i] += 1
        try:
            async with ThreadSensitiveContext(executor=self._executors[i]):
                yield
        finally:
            self._lent[i] -= 1
