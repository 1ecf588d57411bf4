"""How far a model load has got: phase, tensors and bytes, told to plain callbacks.

A load goes through phases: `parse` (the GGUF header and tokenizer), then per tensor
`map` (the file's blocks, or a weight-cache entry, memory-mapped) or `dequantise` (float32
values computed from the file), then `cache_write` (the weight cache publishing what was
built). The engine knows no HTTP: the runtime passes a callback in and keeps the latest
report for the operator routes; `ProgressLog` writes the server log's progress lines.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace

log = logging.getLogger("pantheon.engine.loading")

PARSE, MAP, DEQUANTISE, CACHE_WRITE = "parse", "map", "dequantise", "cache_write"
PHASES = (PARSE, MAP, DEQUANTISE, CACHE_WRITE)


@dataclass(frozen=True)
class LoadProgress:
    phase: str
    tensors_done: int = 0
    tensors_total: int = 0
    bytes_done: int = 0  # of the tensors' bytes as the file stores them
    bytes_total: int = 0

    @property
    def fraction(self) -> float:
        """0..1, by bytes (tensors differ in size by orders of magnitude), else tensors."""
        if self.bytes_total:
            return min(1.0, self.bytes_done / self.bytes_total)
        if self.tensors_total:
            return min(1.0, self.tensors_done / self.tensors_total)
        return 0.0

    def as_dict(self) -> dict:
        return {
            "phase": self.phase,
            "tensors_done": self.tensors_done,
            "tensors_total": self.tensors_total,
            "bytes_done": self.bytes_done,
            "bytes_total": self.bytes_total,
            "fraction": round(self.fraction, 4),
        }


ProgressCallback = Callable[[LoadProgress], None]


class LoadReporter:
    """Counts one load's tensors and bytes and tells each callback after every step. A
    callback that raises is logged and the load goes on: watching must not break it."""

    def __init__(self, callbacks: Iterable[ProgressCallback | None] = ()):
        self._callbacks = [cb for cb in callbacks if cb is not None]
        self.current = LoadProgress(PARSE)

    def _tell(self, progress: LoadProgress) -> None:
        self.current = progress
        for callback in self._callbacks:
            try:
                callback(progress)
            except Exception:
                log.exception("a load progress callback failed")

    def phase(self, phase: str) -> None:
        self._tell(replace(self.current, phase=phase))

    def begin(self, tensors_total: int, bytes_total: int) -> None:
        """The file is open: what there is to do."""
        self._tell(replace(self.current, tensors_total=tensors_total, bytes_total=bytes_total))

    def tensors(self, n: int, nbytes: int, phase: str) -> None:
        """`n` more tensors (`nbytes` of the file's bytes) are in memory, by `phase`."""
        p = self.current
        self._tell(
            replace(
                p,
                phase=phase,
                tensors_done=min(p.tensors_done + n, p.tensors_total),
                bytes_done=min(p.bytes_done + nbytes, p.bytes_total),
            )
        )

    def finish(self) -> None:
        """Loaded: everything counts as done (a file may hold tensors the model never reads)."""
        p = self.current
        self._tell(replace(p, tensors_done=p.tensors_total, bytes_done=p.bytes_total))


class ProgressLog:
    """The server log's progress lines for one load (INFO): on a new phase, every tenth
    of the bytes, at most once a second otherwise, and at the end."""

    def __init__(self, name: str, clock: Callable[[], float] = time.monotonic):
        self.name = name
        self.clock = clock
        self._phase = ""
        self._fraction = -1.0
        self._at = 0.0

    def __call__(self, p: LoadProgress) -> None:
        now = self.clock()
        done = p.tensors_total > 0 and p.tensors_done == p.tensors_total
        if not (
            p.phase != self._phase
            or p.fraction >= self._fraction + 0.1
            or (done and p.fraction > self._fraction)
            or (now - self._at >= 1.0 and p.fraction > self._fraction)
        ):
            return
        self._phase, self._fraction, self._at = p.phase, p.fraction, now
        log.info(
            "loading %s: %s %3.0f%% (%d/%d tensors, %.1f/%.1f MB)",
            self.name,
            p.phase,
            100 * p.fraction,
            p.tensors_done,
            p.tensors_total,
            p.bytes_done / 1e6,
            p.bytes_total / 1e6,
        )
