"""Jobs beside generation (embeddings, prompt scoring, clearing the prefix cache): each a
generator the engine thread advances one `next()` per iteration, between generation
steps, so streams keep flowing.

Fair, not first come first served: jobs are grouped by owner (WORK_OWNER when the job was
submitted: the HTTP layer sets it to the caller's key), the owners take turns one step
each, and so do one owner's jobs. A 2,048-input embedding advances one chunk per turn,
so a one-word embedding submitted after it finishes within a few steps, and a key with
ten jobs queued gets no more turns than a key with one. Each job has its own scratch
state, so the order of steps never changes a result."""

from __future__ import annotations

import collections
import contextvars
import logging
import threading
from collections.abc import Generator
from concurrent.futures import Future, InvalidStateError

from kernels.devices import threads

from ..types import GenerationFailed

log = logging.getLogger("pantheon.engine.service")


# Whom the work submitted from this context is for (an API key's namespace; "" when
# unknown): JobQueue's fairness unit, and the HTTP layer's prepare pool's.
WORK_OWNER: contextvars.ContextVar[str] = contextvars.ContextVar("pantheon_work_owner", default="")


class JobQueue:
    def __init__(self, name: str, lock: threading.Lock):
        self.name = name
        self._lock = lock  # the engine loop's: submitted from any thread
        # owner -> its jobs, in turn order (the owner whose turn is next first)
        self._owners: collections.OrderedDict[str, collections.deque] = collections.OrderedDict()

    def submit(self, job: Generator, owner: str | None = None) -> Future:
        """Queue `job` for `owner` (default: WORK_OWNER); its return value becomes the
        future's result. Cancelling the future drops the job at its next step."""
        future: Future = Future()
        owner = WORK_OWNER.get() if owner is None else owner
        with self._lock:
            self._owners.setdefault(owner, collections.deque()).append((job, future))
        return future

    def __len__(self) -> int:
        with self._lock:
            return sum(len(jobs) for jobs in self._owners.values())

    def advance(self) -> bool:
        """One step (a prefill chunk) of the next owner's next job; False when there is
        none. The owner goes to the back of the turn order, its job to the back of its
        own queue."""
        with self._lock:
            if not self._owners:
                return False
            owner, jobs = next(iter(self._owners.items()))
            job, future = jobs.popleft()
            del self._owners[owner]
            if jobs:
                self._owners[owner] = jobs  # re-inserted: last in the turn order
        if future.cancelled():  # its caller is gone
            job.close()
            return True
        try:
            # A job's step is a prefill pass: its temporaries reuse heap pages (threads.py).
            with threads.prefill_heap():
                next(job)
        except StopIteration as done:
            _settle(future, result=done.value)
        except Exception as exc:
            log.exception("%s: a job failed", self.name)
            _settle(future, error=GenerationFailed(f"failed: {type(exc).__name__}"))
        else:
            with self._lock:
                self._owners.setdefault(owner, collections.deque()).append((job, future))
        return True

    def fail_all(self, error: Exception) -> None:
        with self._lock:
            jobs = [entry for queue in self._owners.values() for entry in queue]
            self._owners.clear()
        for job, future in jobs:
            job.close()
            _settle(future, error=error)


def _settle(future: Future, result: object = None, error: Exception | None = None) -> None:
    """Complete a job's future, unless its caller cancelled it meanwhile."""
    try:
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
    except InvalidStateError:
        pass
