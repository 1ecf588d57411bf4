"""The memory-pressure ladder: how many slots and how much context a model serves now.

The engine thread polls free memory (host memory through psutil on the CPU; device
memory on a GPU) and moves one level per observation: down at once when free memory
falls under a level's threshold, up only once it is clear of the threshold by a margin,
so the numbers do not flap. Each level serves a fraction of the configured slots and
context window; `/v1/models` and `usage.kv_cap` report what is served.
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from dataclasses import dataclass

import psutil


@dataclass(frozen=True)
class Level:
    name: str
    enter_below: float  # free-memory fraction under which this level applies
    slots: float  # fraction of the configured slots served (at least one)
    window: float  # fraction of the configured context window served


LEVELS = (
    Level("normal", 1.01, 1.0, 1.0),
    Level("elevated", 0.20, 0.5, 1.0),
    Level("high", 0.10, 0.25, 0.5),
    Level("critical", 0.05, 0.0, 0.25),
)
CRITICAL = len(LEVELS) - 1
RECOVERY_MARGIN = 0.05  # free fraction above a level's threshold before stepping back up
MIN_WINDOW = 256  # the ladder never clamps the window below this (or the configured one)


def host_memory() -> tuple[int, int]:
    """(available, total) bytes of host memory."""
    vm = psutil.virtual_memory()
    return int(vm.available), int(vm.total)


def device_memory() -> tuple[int, int]:
    """(free, total) bytes of the current CUDA device. CuPy's memory pool keeps the blocks
    our arrays freed (an unloaded model's weights) for the next allocation: the driver
    counts them as used, but they are free to us, so they count as free here."""
    import cupy  # only called when a model runs on the accelerator

    free, total = cupy.cuda.runtime.memGetInfo()
    return int(free) + int(cupy.get_default_memory_pool().free_bytes()), int(total)


class MemoryLadder:
    def __init__(
        self,
        slots: int,
        window: int,
        probe: Callable[[], tuple[int, int]] = host_memory,
    ):
        self.configured_slots = slots
        self.configured_window = window
        self.probe = probe
        self.level = 0
        self.simulated: int | None = None  # an operator's test hook pins the level
        # observe() runs on the engine thread, simulate() on a request's: one at a time.
        self._lock = threading.Lock()

    # --- what is served ----------------------------------------------------------------

    @property
    def slots(self) -> int:
        return max(1, int(self.configured_slots * LEVELS[self.level].slots))

    @property
    def window(self) -> int:
        floor = min(self.configured_window, MIN_WINDOW)
        return max(floor, int(self.configured_window * LEVELS[self.level].window))

    @property
    def level_name(self) -> str:
        return LEVELS[self.level].name

    # --- moving -------------------------------------------------------------------------

    def observe(self) -> bool:
        """Poll free memory and move at most one level; True when the served values moved."""
        with self._lock:
            return self._observe()

    def _observe(self) -> bool:
        if self.simulated is not None:
            return self._move_to(self.simulated)
        available, total = self.probe()
        free = available / total if total else 1.0
        target = self.level
        if self.level < CRITICAL and free < LEVELS[self.level + 1].enter_below:
            target = self.level + 1
        elif self.level > 0 and free >= LEVELS[self.level].enter_below + RECOVERY_MARGIN:
            target = self.level - 1
        return self._move_to(target)

    def simulate(self, level: int | None) -> bool:
        """Pin the ladder at `level` (0 = normal .. CRITICAL), or None to follow the probe
        again (from the level free memory calls for now). True when the served values moved."""
        if level is not None and not 0 <= level <= CRITICAL:
            raise ValueError(f"pressure level must be 0..{CRITICAL}")
        with self._lock:
            return self._simulate(level)

    def _simulate(self, level: int | None) -> bool:
        self.simulated = level
        if level is None:
            available, total = self.probe()
            free = available / total if total else 1.0
            level = max(i for i, lv in enumerate(LEVELS) if free < lv.enter_below)
        return self._move_to(level)

    def available_bytes(self) -> int:
        """Free memory now; under a simulated level, the middle of that level's band."""
        available, total = self.probe()
        if self.simulated is None:
            return available
        upper = LEVELS[self.simulated].enter_below if self.simulated else 1.0
        lower = LEVELS[self.simulated + 1].enter_below if self.simulated < CRITICAL else 0.0
        return min(available, math.floor(total * (upper + lower) / 2))

    def _move_to(self, level: int) -> bool:
        before = (self.slots, self.window)
        self.level = level
        return (self.slots, self.window) != before
