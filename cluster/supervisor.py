"""The local cluster's supervisor (`make cluster`, cluster/local_cluster.py): a process
that exits is started again, after a delay that doubles while it keeps failing (1 s, 2 s,
... 30 s; back to 1 s once it has run a minute), so one instance dying neither tears the
cluster down nor spins. SIGTERM or Ctrl-C stops everything: the last started first (the
instances, which drain and deregister from the router, before the router and Redis)."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

FIRST_DELAY_S = 1.0
MAX_DELAY_S = 30.0
STABLE_S = 60.0  # a process that ran this long failed afresh: its delay starts over
STOP_WAIT_S = 30.0


class Supervised:
    """One process: how to start it, the running one, and its restart schedule."""

    def __init__(self, name: str, start: Callable[[], subprocess.Popen]):
        self.name, self.start = name, start
        self.proc: subprocess.Popen | None = None
        self.started_at = 0.0
        self.delay_s = FIRST_DELAY_S
        self.restart_at: float | None = None  # when a dead one is started again
        self.restarts = 0


class Supervisor:
    def __init__(
        self,
        first_delay_s: float = FIRST_DELAY_S,
        max_delay_s: float = MAX_DELAY_S,
        stable_s: float = STABLE_S,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.first_delay_s, self.max_delay_s, self.stable_s = first_delay_s, max_delay_s, stable_s
        self.clock = clock
        self.children: list[Supervised] = []
        self.stopping = threading.Event()

    def add(self, name: str, start: Callable[[], subprocess.Popen]) -> Supervised:
        """Start a process now and keep it running."""
        child = Supervised(name, start)
        child.delay_s = self.first_delay_s
        self._start(child)
        self.children.append(child)
        return child

    def tick(self) -> None:
        """Notice exits and start again the processes whose delay is over."""
        now = self.clock()
        for child in self.children:
            if child.restart_at is None and child.proc.poll() is not None:
                if now - child.started_at >= self.stable_s:
                    child.delay_s = self.first_delay_s
                child.restart_at = now + child.delay_s
                print(
                    f"{child.name} exited with {child.proc.returncode}; starting it again "
                    f"in {child.delay_s:g} s",
                    file=sys.stderr,
                )
                child.delay_s = min(self.max_delay_s, child.delay_s * 2)
            if child.restart_at is not None and now >= child.restart_at:
                child.restarts += 1
                self._start(child)

    def run(self, poll_s: float = 0.5) -> None:
        """Supervise until SIGTERM (or Ctrl-C), then stop everything."""
        previous = signal.signal(signal.SIGTERM, lambda *_: self.stopping.set())
        try:
            while not self.stopping.wait(poll_s):
                self.tick()
        except KeyboardInterrupt:
            pass
        finally:
            signal.signal(signal.SIGTERM, previous)
            self.stop()

    def stop(self) -> None:
        self.stopping.set()
        running = [c.proc for c in reversed(self.children) if c.proc is not None]
        for proc in running:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in running:
            try:
                proc.wait(STOP_WAIT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(10)

    def _start(self, child: Supervised) -> None:
        try:
            child.proc = child.start()
        except Exception as exc:  # e.g. a failed migrate: tried again after the delay
            print(f"{child.name} did not start: {exc}", file=sys.stderr)
            if child.proc is None:
                raise
            child.restart_at = self.clock() + child.delay_s
            child.delay_s = min(self.max_delay_s, child.delay_s * 2)
            return
        child.started_at = self.clock()
        child.restart_at = None
