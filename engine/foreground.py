"""Foreground work announces itself so background work on other threads can step aside.

On a 2-core host a prompt's prefill (someone waits for its first token) shares the cores
with whatever else the process runs; the costliest of that is bulk preparation, such as
tokenizing a multi-megabyte text, which runs on a prepare thread without the GIL. The
engine thread marks its prefill passes (`FOREGROUND.running()`); bulk work calls
`FOREGROUND.wait_quiet(max_s)` between its pieces, so a flood of huge texts costs an
interactive prompt at most one piece of contention. The wait is bounded: a server
prefilling without pause still tokenizes a piece every `max_s`.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator


class Foreground:
    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._running = 0

    @contextlib.contextmanager
    def running(self) -> Iterator[None]:
        with self._cond:
            self._running += 1
        try:
            yield
        finally:
            with self._cond:
                self._running -= 1
                if not self._running:
                    self._cond.notify_all()

    def busy(self) -> bool:
        return self._running > 0

    def wait_quiet(self, max_s: float) -> bool:
        """Wait until no foreground work runs, at most `max_s`; whether it is quiet."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._running, timeout=max_s)


FOREGROUND = Foreground()
