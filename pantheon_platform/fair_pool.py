"""A thread pool that shares its workers fairly between owners (API keys).

Request preparation (parse, validate, the chat template, tokenize) runs off the event
loop on a few workers. First come first served, one key sending 30 MB /tokenize bodies
in a loop holds every worker, and everyone else's chats wait past their deadline (429
server_busy). Here queued work is grouped by owner (engine.WORK_OWNER: the caller's key)
and a free worker takes the next job of the owner running the fewest, owners in turn;
no owner runs on more than `per_owner` workers at once; and an owner running nothing
gets a worker at once even when all are busy, up to `burst` extra threads, so a key over
its share waits and the others do not.
"""

from __future__ import annotations

import collections
import contextvars
import os
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor

from engine import WORK_OWNER


class FairPool:
    def __init__(
        self, workers: int, per_owner: int, burst: int, thread_name_prefix: str, nice: int = 0
    ):
        self.workers, self.per_owner, self.burst = workers, per_owner, burst
        self._executor = ThreadPoolExecutor(
            max_workers=workers + burst,
            thread_name_prefix=thread_name_prefix,
            initializer=_lower_priority,
            initargs=(nice,),
        )
        self._lock = threading.Lock()
        self._queued: collections.OrderedDict[str, collections.deque] = collections.OrderedDict()
        self._running: collections.Counter[str] = collections.Counter()

    def submit(self, fn: Callable, owner: str | None = None) -> Future:
        """Run `fn()` (in the caller's context) for `owner` (default: WORK_OWNER)."""
        owner = WORK_OWNER.get() if owner is None else owner
        future: Future = Future()
        context = contextvars.copy_context()
        with self._lock:
            self._queued.setdefault(owner, collections.deque()).append((context, fn, future))
            self._dispatch()
        return future

    def running(self, owner: str) -> int:
        with self._lock:
            return self._running[owner]

    def _dispatch(self) -> None:
        """Start what may start now (under the lock)."""
        while True:
            owner = self._next_owner()
            if owner is None:
                return
            context, fn, future = self._queued[owner].popleft()
            if not self._queued[owner]:
                del self._queued[owner]
            else:
                self._queued.move_to_end(owner)  # owners take turns
            if not future.set_running_or_notify_cancel():
                continue  # cancelled while queued: never runs
            self._running[owner] += 1
            self._executor.submit(self._run, owner, context, fn, future)

    def _next_owner(self) -> str | None:
        """The queued owner that may start a job: the one running the fewest (ties: the
        turn order), within per_owner; beyond `workers` only an owner running nothing."""
        total = sum(self._running.values())
        best = None
        for owner in self._queued:
            running = self._running[owner]
            if running >= self.per_owner:
                continue
            if total >= self.workers and (running or total >= self.workers + self.burst):
                continue
            if best is None or running < self._running[best]:
                best = owner
        return best

    def _run(self, owner: str, context, fn: Callable, future: Future) -> None:
        error = result = None
        try:
            result = context.run(fn)
        except BaseException as exc:  # handed to the caller, as an executor does
            error = exc
        with self._lock:  # the share freed before the caller hears back
            self._running[owner] -= 1
            if not self._running[owner]:
                del self._running[owner]
            self._dispatch()
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)


def _lower_priority(nice: int) -> None:
    """This worker thread's scheduling priority lowered by `nice` (Linux: a thread is a
    task of its own), so that when the cores are short the engine's kernel threads,
    which every stream waits on, run first and a flood of preparation work yields."""
    if nice <= 0:
        return
    try:
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), nice)
    except (AttributeError, OSError):  # not Linux, or not permitted: the default priority
        pass
