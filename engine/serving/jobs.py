"""Jobs beside generation (embeddings, prompt scoring, clearing the prefix cache): each a
generator the engine thread advances one `next()` per iteration, between generation
steps, so streams keep flowing; first come first served."""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Generator
from concurrent.futures import Future, InvalidStateError

from ..types import GenerationFailed

log = logging.getLogger("pantheon.engine.service")


class JobQueue:
    def __init__(self, name: str, lock: threading.Lock):
        self.name = name
        self._lock = lock  # the engine loop's: submitted from any thread
        self._jobs: collections.deque[tuple[Generator, Future]] = collections.deque()

    def submit(self, job: Generator) -> Future:
        """Queue `job`; its return value becomes the future's result. Cancelling the
        future drops the job at its next step."""
        future: Future = Future()
        with self._lock:
            self._jobs.append((job, future))
        return future

    def advance(self) -> bool:
        """One step of the oldest job (a prefill chunk); False when there is none."""
        with self._lock:
            if not self._jobs:
                return False
            job, future = self._jobs.popleft()
        if future.cancelled():  # its caller is gone
            job.close()
            return True
        try:
            next(job)
        except StopIteration as done:
            _settle(future, result=done.value)
        except Exception as exc:
            log.exception("%s: a job failed", self.name)
            _settle(future, error=GenerationFailed(f"failed: {type(exc).__name__}"))
        else:
            with self._lock:
                self._jobs.appendleft((job, future))
        return True

    def fail_all(self, error: Exception) -> None:
        with self._lock:
            jobs = list(self._jobs)
            self._jobs.clear()
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
