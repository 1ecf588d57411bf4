"""Kept threads for a request's thread-sensitive calls, instead of one new thread each.

Django's ASGIHandler enters `ThreadSensitiveContext()` per request, so the first
thread-sensitive `sync_to_async` of each request (the `request_started` signal's sync
receivers, at the latest `response.close`) starts a fresh thread, and the event loop
waits in `Thread.start` until the new thread runs. On a host whose cores are busy with
the kernels that wait is milliseconds per request, with the loop stopped: a burst of
eight streamed chats spent ~2.5 ms a request there (py-spy, bench/RESULTS.md
2026-12-04, fourth session). Here each request borrows an idle single-thread executor
(asgiref's `ThreadSensitiveContext(executor=...)`), a new one only when none is idle, and
gives it back when it ends: as with Django's, a request's sync calls run one at a time
on a thread no other request uses meanwhile (database connections are per thread; an
operator's unload may wait minutes in its sync view and holds up nobody), and up to
KEEP idle threads wait for the next requests instead of ending.
"""

from __future__ import annotations

import contextlib
from concurrent.futures import ThreadPoolExecutor

from asgiref.sync import ThreadSensitiveContext

# Idle request threads kept: a burst of concurrent requests starts no thread after the
# first such burst; each is one idle thread.
KEEP = 8


class RequestThreads:
    """Single-thread executors lent one per request, never two requests at once (event
    loop thread only, so the idle list needs no lock)."""

    def __init__(self, keep: int = KEEP) -> None:
        self.keep = keep
        self._idle: list[ThreadPoolExecutor] = []
        self._made = 0

    @contextlib.asynccontextmanager
    async def lend(self):
        executor = self._idle.pop() if self._idle else self._new()
        try:
            async with ThreadSensitiveContext(executor=executor):
                yield
        finally:
            if len(self._idle) < self.keep:
                self._idle.append(executor)
            else:
                executor.shutdown(wait=False)

    def _new(self) -> ThreadPoolExecutor:
        self._made += 1
        return ThreadPoolExecutor(
            max_workers=1, thread_name_prefix=f"pantheon-request-{self._made}"
        )
