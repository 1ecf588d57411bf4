"""Priority classes: `interactive` (live requests, the default) before `batch` (the
Batches API's lines, or a request that asked for it). The scheduler's half that is about
the batch class (scheduler.py calls it):

- Batch groups wait in a queue of their own: never refused as busy (the batch runner
  bounds how many it sends), never timed out, never ahead of an interactive group. They
  are admitted only while no interactive group waits, into at most `share` of the served
  slots.
- An interactive group that finds too few free slots takes them from decoding batch
  groups: each such group is *parked* (its slots freed, the KV positions it wrote owed
  to the engine thread as a copy out, `moves`), and *unparked* into free slots later,
  its KV copied back, before any batch group still queued. Its next token is computed
  from the same KV and the same last token: parking never changes a sequence's output.
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from .batch import Started

if TYPE_CHECKING:
    from .scheduler import Scheduler, _Group

INTERACTIVE, BATCH = "interactive", "batch"
PRIORITIES = (INTERACTIVE, BATCH)


@dataclass
class Moves:
    """The KV copies a step's admission owes the engine thread, in this order: park
    (seq id, slot, positions) out of its slot, drop (seq ids) the parked KV of sequences
    gone, unpark (seq id, slot) into its new slot."""

    park: list[tuple[int, int, int]] = field(default_factory=list)
    drop: list[int] = field(default_factory=list)
    unpark: list[tuple[int, int]] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.park or self.drop or self.unpark)


class BatchLane:
    def __init__(self, share: float = 1.0):
        self.share = min(1.0, max(0.0, share))
        self.waiting: deque[_Group] = deque()
        self.parked: deque[_Group] = deque()
        self.moves = Moves()
        self.parks_total = 0  # groups parked since start (stats, tests)

    def cap(self, served_slots: int) -> int:
        """The most slots batch sequences may hold."""
        return max(1, math.floor(self.share * served_slots))

    def pop_moves(self) -> Moves:
        moves, self.moves = self.moves, Moves()
        return moves

    def forget(self, group: _Group) -> None:
        """A parked group cancelled: its parked KV is dropped."""
        if group in self.parked:
            self.parked.remove(group)
            self.moves.drop.extend(s.seq_id for s in group.seqs)

    # --- parking ---------------------------------------------------------------------------

    def parkable(self, sched: Scheduler) -> list[_Group]:
        """Running batch groups that can give their slots up now: decoding, every live
        choice in a slot (newest first: the least work waits)."""
        groups = []
        for group in reversed(sched._running.values()):
            live = [s for s in group.seqs if not s.done]
            if group.priority == BATCH and group.prompt_done and live:
                if all(s.slot >= 0 for s in live):
                    groups.append(group)
        return groups

    def free_for_interactive(self, sched: Scheduler) -> int:
        """Slots an interactive group could have now: free ones and parkable ones."""
        free = min(sched.served_slots - sched.running, len(sched._free))
        return free + sum(sum(1 for s in g.seqs if not s.done) for g in self.parkable(sched))

    def park_for(self, sched: Scheduler, k: int) -> bool:
        """Free `k` slots for an interactive group by parking batch groups; False (none
        parked) if even all of them would not make room."""
        if self.free_for_interactive(sched) < k:
            return False
        for group in self.parkable(sched):
            if min(sched.served_slots - sched.running, len(sched._free)) >= k:
                break
            for seq in group.seqs:
                if not seq.done and seq.slot >= 0:
                    self.moves.park.append((seq.seq_id, seq.slot, sched._position(seq)))
                    heapq.heappush(sched._free, seq.slot)
                    seq.slot = -1
            group.parked = True
            self.parked.append(group)
            self.parks_total += 1
        return True

    # --- admission -------------------------------------------------------------------------

    def admit(self, sched: Scheduler) -> list[Started]:
        """Parked groups back into slots, then queued batch groups, while no interactive
        group waits and within the batch share."""
        if sched._waiting:
            return []
        cap = self.cap(sched.served_slots)
        holding = sum(1 for s in sched._seqs.values() if s.slot >= 0 and s.group.priority == BATCH)
        while self.parked:
            group = self.parked[0]
            live = [s for s in group.seqs if not s.done]
            if not live:  # ended while parked (a lowered window)
                self.parked.popleft()
                self.moves.drop.extend(s.seq_id for s in group.seqs)
                continue
            if not self._room(sched, len(live), holding, cap):
                return []
            self.parked.popleft()
            group.parked = False
            for seq in live:
                seq.slot = heapq.heappop(sched._free)
                self.moves.unpark.append((seq.seq_id, seq.slot))
            holding += len(live)
        started = []
        while self.waiting:
            group = self.waiting[0]
            k = min(group.n, sched.served_slots)
            if not self._room(sched, k, holding, cap):
                break
            self.waiting.popleft()
            started.append(sched._start_group(group, k))
            holding += k
        return started

    @staticmethod
    def _room(sched: Scheduler, k: int, holding: int, cap: int) -> bool:
        free = min(sched.served_slots - sched.running, len(sched._free))
        return free >= k and holding + k <= max(cap, k)
