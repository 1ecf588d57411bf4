"""CUDA-graph slots of a model's decode step, and what the contract's `graphs` object says
of them.

A slot is one captured graph: a stage's whole decode step (class "segment": the per-die
full-step graph) for one batch-size bucket. A step of B rows runs in the smallest bucket
that holds it, its spare rows padded onto a scratch KV slot (each row is computed alone,
so padding changes no real row's bits). A slot is created the first time a step exercises
its bucket (`total` counts only exercised slots), captured on its second use (the first
runs direct: kernels compile and cuBLAS allocates its workspace outside any capture), and
replayed after that. A capture that fails leaves the step on the direct kernels, which
compute the same bits, slower; it is retried after a backoff that doubles, and given up
(`gave_up`) after MAX_CAPTURE_FAILURES. A step wider than the largest bucket is
`ineligible`: it always runs direct, which is normal.

A graph reads and writes the KV cache it was captured on, so a slot's key names the cache
too (`SplitKV.serial`): another cache of the same model captures graphs of its own.

The bookkeeping here is plain Python (the suite runs it with a capture function of its
own); kernels/cuda/graphs.py captures and replays on CuPy.
"""

from __future__ import annotations

import bisect
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

BUCKETS = (1, 2, 4, 8, 16, 32, 64)
MAX_CAPTURE_FAILURES = 4
FIRST_BACKOFF_S = 1.0

PENDING, LIVE, FAILED, INELIGIBLE = "pending", "live", "failed", "ineligible"
SUMMARY_KEYS = ("live", "total", "failed", "ineligible", "pending")


def bucket_for(rows: int, buckets=BUCKETS) -> int | None:
    """The smallest bucket holding `rows`, None past the largest."""
    i = bisect.bisect_left(buckets, rows)
    return buckets[i] if i < len(buckets) else None


@dataclass
class Slot:
    state: str = PENDING
    uses: int = 0
    failures: int = 0
    retry_at: float = 0.0
    graph: Any = None  # what the capture function returned: called to replay
    error: str = ""  # why the last capture failed

    @property
    def gave_up(self) -> bool:
        return self.state == FAILED and self.failures >= MAX_CAPTURE_FAILURES


class GraphSlots:
    """The slots of one class ("segment") for every stage of one model.

    `run(key, rows, direct, capture, *inputs)`: `direct(*inputs)` computes the step with
    the direct kernels; `capture(bucket)` captures it for `bucket` rows and returns
    `replay(*inputs)`, which computes the same step for any inputs of up to `bucket` rows,
    or raises. Only a die's engine thread calls `run`; `report` may be called from any
    thread."""

    def __init__(
        self,
        klass: str = "segment",
        buckets=BUCKETS,
        clock: Callable[[], float] = time.monotonic,
    ):
        self.klass = klass
        self.buckets = tuple(buckets)
        self.clock = clock
        self.slots: dict[tuple[Any, int | None], Slot] = {}
        self.captures = 0
        self.capture_failures = 0
        self._lock = threading.Lock()

    def run(self, key, rows: int, direct: Callable, capture: Callable[[int], Callable], *inputs):
        bucket = bucket_for(rows, self.buckets)
        with self._lock:
            slot = self.slots.get((key, bucket))
            if slot is None:
                slot = Slot(INELIGIBLE if bucket is None else PENDING)
                self.slots[(key, bucket)] = slot
            slot.uses += 1
        if slot.state == LIVE:
            return slot.graph(*inputs)
        if slot.state == INELIGIBLE or slot.uses < 2 or slot.gave_up:
            return direct(*inputs)
        if slot.state == FAILED and self.clock() < slot.retry_at:
            return direct(*inputs)
        try:
            replay = capture(bucket)
        except Exception as exc:  # the direct kernels compute the same bits: no one waits
            with self._lock:
                self.capture_failures += 1
                slot.failures += 1
                slot.state, slot.error = FAILED, f"{type(exc).__name__}: {exc}"
                slot.retry_at = self.clock() + FIRST_BACKOFF_S * 2 ** (slot.failures - 1)
            return direct(*inputs)
        with self._lock:
            self.captures += 1
            slot.state, slot.graph, slot.error = LIVE, replay, ""
        return replay(*inputs)

    def drop(self) -> None:
        """Forget every captured graph (the model is unloading)."""
        with self._lock:
            for slot in self.slots.values():
                slot.graph = None

    def drop_cache(self, cache) -> None:
        """Forget the slots of one KV cache (keys are (stage, cache)): it is released."""
        with self._lock:
            for key in [k for k in self.slots if k[0][1] == cache]:
                del self.slots[key]

    # ---- the contract's `graphs` object ----

    @staticmethod
    def _summary(slots: list[Slot]) -> dict:
        counts = dict.fromkeys(SUMMARY_KEYS, 0)
        for slot in slots:
            counts[slot.state] += 1
        counts["total"] = len(slots)
        return counts

    def report(self, operator: bool = False) -> dict | None:
        """/v1/models' `graphs` (operator: /admin/models' form, with gave_up, the lifetime
        counters and the per-class split); None while no slot was exercised."""
        with self._lock:
            slots = list(self.slots.values())
            captures, failures = self.captures, self.capture_failures
        if not slots:
            return None
        summary = self._summary(slots)
        if not operator:
            return summary
        summary["gave_up"] = sum(1 for s in slots if s.gave_up)
        summary["captures"] = captures
        summary["capture_failures"] = failures
        summary[self.klass] = self._summary(slots)
        return summary
