"""Continuous batching as pure bookkeeping: which sequences prefill and decode each step.

No model, no arrays, no threads. The protocol, one engine step (serving/loop.py), is:
`expire()` (queued requests past their timeout), `admit()` (queued groups into free
slots), `resume()` for each admitted group whose prompt starts with KV that exists
already, `plan(started)` (the step's Batch), run it, `update(batch, sampled)` (the events
to deliver). The HTTP side adds and cancels requests (under the loop's lock). Tested
with no model and fake token ids (the value types are in batch.py).

The rules:
- A request (a *group* of `n` choices, each a *sequence*) waits in a FIFO until
  `min(n, served slots)` slots are free. No request overtakes the head of the queue.
- A group's prompt is prefilled once, on its first sequence's slot, in chunks at fixed
  boundaries (multiples of `prefill_chunk`), so the same prompt is always computed in the
  same passes, whatever else runs. Each step prefills at most `prefill_chunk` prompt
  tokens (always at least one chunk), then decodes every running sequence one token: a
  long prompt delays the running streams by one chunk per step, never more.
- On the prompt's last chunk its KV is copied to the other choices' slots and every
  choice samples its first token from the last position's logits, the choices without a
  slot too (`n` above the served slots): those wait, holding that token, for a slot of
  their own group.
- A finished or cancelled sequence frees its slot at once, for the next `admit()`;
  a finished one whose group has a choice waiting hands the slot to it instead (the
  prompt's KV is already there, positions 0 .. len(prompt); what the finished choice
  wrote after it is overwritten before it is read). So a group holds the slots it was
  admitted with until its last choice ends, never more: its later choices run in turn,
  and the queue behind it waits as behind any long request (queue timeout included).
  Under a lowered slot count (the memory ladder) a slot is handed on only if it is the
  group's last one.
- A group may resume from a cached prefix (a session's earlier turns): between `admit()`
  and `plan()` the engine copies that KV into the group's first slot and calls
  `resume()`; its prefill then starts after the cached tokens, its chunks counted from
  there.
"""

from __future__ import annotations

import heapq
import itertools
import time
from collections import deque
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field

from .batch import (
    FINISH_LENGTH,
    FINISH_STOP,
    REFUSED_MEMORY,
    REFUSED_QUEUE_TIMEOUT,
    Batch,
    DecodeRow,
    Finished,
    PrefillChunk,
    QueueFull,
    Refused,
    Sampled,
    Started,
)
from .priority import BATCH, INTERACTIVE, BatchLane

# --- state -------------------------------------------------------------------------------


@dataclass(eq=False)
class _Seq:
    seq_id: int
    group: _Group
    index: int
    slot: int = -1  # -1: waiting for one of its group's slots
    n_out: int = 0  # sampled tokens that count as output (end-of-turn does not)
    last_token: int = -1
    done: bool = False


@dataclass(eq=False)
class _Group:
    group_id: int
    prompt: tuple[int, ...]
    n: int
    max_tokens: int
    enqueued_at: float
    namespace: str = ""  # whose kept prefixes it may reuse (choose_slot)
    session: str | None = None  # the session id whose turn it is (choose_slot)
    priority: str = INTERACTIVE  # its class (priority.py)
    parked: bool = False  # a batch group whose slots an interactive one took
    seqs: list[_Seq] = field(default_factory=list)
    prefilled: int = 0  # prompt tokens whose KV is written (on seqs[0]'s slot)
    cached: int = 0  # of those, resumed from a cache (resume())

    @property
    def prompt_done(self) -> bool:
        return self.prefilled >= len(self.prompt)


class Scheduler:
    def __init__(
        self,
        n_slots: int,
        context_window: int,
        *,
        prefill_chunk: int = 256,
        queue_depth: int = 32,
        queue_timeout_s: float = 30.0,
        end_ids: Collection[int] = (),
        clock: Callable[[], float] = time.monotonic,
        choose_slot: Callable[[tuple[int, ...], list[int], str, str | None], int] | None = None,
        batch_share: float = 1.0,
    ):
        if n_slots < 1:
            raise ValueError("a scheduler needs at least one slot")
        self.n_slots = n_slots
        self.served_slots = n_slots  # the memory ladder may lower it (set_limits)
        self.context_window = context_window
        self.prefill_chunk = max(1, prefill_chunk)
        self.queue_depth = max(0, queue_depth)
        self.queue_timeout_s = queue_timeout_s
        self.end_ids = frozenset(end_ids)
        self.clock = clock
        # (prompt, free slots, the group's cache namespace) -> the slot for a group's
        # first sequence (the prefix cache's choice); None: the lowest free slot.
        self.choose_slot = choose_slot
        self._free: list[int] = list(range(n_slots))  # a heap: the lowest free slot first
        self._waiting: deque[_Group] = deque()  # interactive groups
        self.lane = BatchLane(batch_share)  # batch groups: their queue, the parked ones
        self._running: dict[int, _Group] = {}  # admission order
        self._seqs: dict[int, _Seq] = {}  # running groups' unfinished sequences
        self._group_ids = itertools.count(1)
        self._seq_ids = itertools.count(1)
        self._freed: list[int] = []
        self.mean_sequence_steps = 0.0  # of the finished sequences (steps_until_admitted)
        self._finished_sequences = 0

    # --- the HTTP side -------------------------------------------------------------------

    def add(
        self,
        prompt: tuple[int, ...],
        n: int = 1,
        max_tokens: int = 1,
        namespace: str = "",
        priority: str = INTERACTIVE,
        session: str | None = None,
    ) -> int:
        """Queue a request of `n` choices (`namespace`: whose kept prefixes it may reuse);
        returns its group id. Raises QueueFull (an interactive request only)."""
        group = _Group(next(self._group_ids), tuple(prompt), max(1, n), max_tokens, self.clock())
        group.namespace, group.session = namespace, session
        if priority == BATCH:  # never refused: the batch runner bounds what it sends
            group.priority = BATCH
            self.lane.waiting.append(group)
            return group.group_id
        if self._queued_behind(min(n, self.served_slots)) >= self.queue_depth + 1:
            raise QueueFull(
                f"all {self.served_slots} slots are busy and {self.queued} requests wait"
            )
        self._waiting.append(group)
        return group.group_id

    def cancel(self, group_id: int) -> bool:
        """Forget a group (its client is gone): out of the queue, or its slots freed now."""
        for queue in (self._waiting, self.lane.waiting):
            for group in queue:
                if group.group_id == group_id:
                    queue.remove(group)
                    return True
        group = self._running.pop(group_id, None)
        if group is None:
            return False
        self.lane.forget(group)
        live = [seq for seq in group.seqs if not seq.done]
        for seq in live:
            seq.done = True
        for seq in live:
            self._release(seq)
        return True

    # --- the engine thread ---------------------------------------------------------------

    def admit(self) -> list[Started]:
        """Move the queued groups that fit now into slots (the head of the queue first)."""
        started = []
        while self._waiting:
            group = self._waiting[0]
            # More choices than the served slots can never start together: the first
            # ones start, the others wait for the group's slots.
            k = min(group.n, self.served_slots)
            if self.served_slots - self.running < k or len(self._free) < k:
                if not self.lane.park_for(self, k):  # batch groups give their slots up
                    break
            self._waiting.popleft()
            started.append(self._start_group(group, k))
        return started + self.lane.admit(self)

    def _start_group(self, group: _Group, k: int) -> Started:
        """A queued group into slots: its first `k` choices hold one each."""
        for index in range(group.n):
            slot = self._take_slot(group if index == 0 else None) if index < k else -1
            seq = _Seq(next(self._seq_ids), group, index, slot=slot)
            group.seqs.append(seq)
            self._seqs[seq.seq_id] = seq
        self._running[group.group_id] = group
        return Started(
            group.group_id,
            tuple(q.seq_id for q in group.seqs),
            tuple(q.slot for q in group.seqs[:k]),
        )

    def resume(self, group_id: int, cached: int) -> bool:
        """A group just admitted starts with its prompt's first `cached` tokens already in
        its first slot's KV (at most all but one: the last prompt token gives the logits).
        False if the group is gone (cancelled meanwhile)."""
        group = self._running.get(group_id)
        if group is None or group.prefilled:
            return False
        group.cached = group.prefilled = max(0, min(cached, len(group.prompt) - 1))
        return True

    def plan(self, started: list[Started] | tuple[Started, ...] = ()) -> Batch:
        """One step's work for the running groups: prefill chunks within the token budget
        and one decode row per running sequence."""
        budget = self.prefill_chunk
        chunks: list[PrefillChunk] = []
        decode: list[DecodeRow] = []
        for group in self._running.values():
            if group.prompt_done:
                for seq in group.seqs:
                    if not seq.done and seq.slot >= 0:
                        decode.append(
                            DecodeRow(seq.seq_id, seq.slot, self._position(seq), seq.last_token)
                        )
                continue
            start = group.prefilled
            # Chunk boundaries sit at fixed offsets from where the prefill began (0, or
            # after a resumed prefix): the same prompt from the same state is always
            # computed in the same passes, and a short delta is one pass.
            base, size = group.cached, self.prefill_chunk
            end = min(len(group.prompt), base + ((start - base) // size + 1) * size)
            if end - start > budget and chunks:
                continue  # whole chunks only; the first chunk of a step always runs
            budget -= end - start
            first, *others = group.seqs
            last = end == len(group.prompt)
            chunks.append(
                PrefillChunk(
                    seq_id=first.seq_id,
                    slot=first.slot,
                    start=start,
                    token_ids=group.prompt[start:end],
                    copy_to_slots=tuple(s.slot for s in others if s.slot >= 0) if last else (),
                    sample_seq_ids=tuple(s.seq_id for s in group.seqs) if last else (),
                )
            )
        return Batch(prefill=tuple(chunks), decode=tuple(decode), started=tuple(started))

    def update(self, batch: Batch, sampled: Mapping[int, int]) -> list[object]:
        """Record a run batch and its sampled ids; the events to deliver, in order.

        Sequences cancelled or finished while the batch ran, or not sampled, are skipped.
        """
        events: list[object] = []
        for chunk in batch.prefill:
            seq = self._seqs.get(chunk.seq_id)
            if seq is not None:
                seq.group.prefilled = max(seq.group.prefilled, chunk.start + len(chunk.token_ids))
        for seq_id in batch.sampling_seq_ids():
            seq = self._seqs.get(seq_id)
            if seq is None or seq.done or seq_id not in sampled:
                continue
            token = int(sampled[seq_id])
            if token in self.end_ids:
                events.append(self._finish(seq, FINISH_STOP, fed_last=True))
                continue
            seq.n_out += 1
            seq.last_token = token
            events.append(Sampled(seq.group.group_id, seq_id, seq.index, token))
            if seq.n_out >= seq.group.max_tokens or self._position(seq) >= self.context_window:
                events.append(self._finish(seq, FINISH_LENGTH))
        return events

    def finish(self, seq_id: int, reason: str = FINISH_STOP) -> Finished | None:
        """End a sequence early (a stop string matched); None if it already ended."""
        seq = self._seqs.get(seq_id)
        if seq is None or seq.done:
            return None
        return self._finish(seq, reason)

    def draft_room(self, seq_id: int) -> int:
        """Tokens a decoding sequence may have verified after this step's one (speculation):
        within its max_tokens and the context window, 0 for one not decoding."""
        seq = self._seqs.get(seq_id)
        if seq is None or seq.done or seq.slot < 0 or not seq.group.prompt_done:
            return 0
        by_tokens = seq.group.max_tokens - seq.n_out - 1
        by_window = self.context_window - 1 - self._position(seq)
        return max(0, min(by_tokens, by_window))

    def expire(self) -> list[Refused]:
        """Queued groups that waited `queue_timeout_s`: out of the queue, to be refused."""
        now = self.clock()
        expired = [g for g in self._waiting if now - g.enqueued_at >= self.queue_timeout_s]
        for group in expired:
            self._waiting.remove(group)
        return [
            Refused(
                g.group_id,
                REFUSED_QUEUE_TIMEOUT,
                f"no slot became free within {self.queue_timeout_s:g} s",
            )
            for g in expired
        ]

    def set_limits(self, served_slots: int, context_window: int) -> list[object]:
        """The memory ladder moved: serve this many slots and this window from now on.

        Running sequences are never preempted for a lower slot count (new ones wait
        instead), but a lower window ends the sequences already past it (`length`) and
        refuses the groups whose prompt no longer fits. Returns those events.
        """
        self.served_slots = max(1, min(served_slots, self.n_slots))
        self.context_window = context_window
        events: list[object] = []
        for group in list(self._running.values()):
            if not group.prompt_done:
                if len(group.prompt) > context_window:  # no token was produced yet
                    self.cancel(group.group_id)
                    events.append(Refused(group.group_id, REFUSED_MEMORY, _no_room(group)))
                continue
            for seq in group.seqs:
                if not seq.done and self._position(seq) >= context_window:
                    events.append(self._finish(seq, FINISH_LENGTH))
        for queue in (self._waiting, self.lane.waiting):
            for group in [g for g in queue if len(g.prompt) > context_window]:
                queue.remove(group)
                events.append(Refused(group.group_id, REFUSED_MEMORY, _no_room(group)))
        return events

    def pop_freed_slots(self) -> list[int]:
        """Slots freed since the last call that are still free (their KV can be dropped)."""
        freed, self._freed = self._freed, []
        free = set(self._free)
        return sorted({s for s in freed if s in free})

    # --- views -----------------------------------------------------------------------------

    @property
    def in_flight(self) -> int:
        """Requests admitted and not finished, queued ones included."""
        return len(self._waiting) + len(self.lane.waiting) + len(self._running)

    @property
    def queued(self) -> int:
        """Groups waiting for slots, both classes (parked ones are running)."""
        return len(self._waiting) + len(self.lane.waiting)

    @property
    def running(self) -> int:
        """Sequences holding a slot."""
        return self.n_slots - len(self._free)

    @property
    def kv_tokens(self) -> int:
        """KV positions the sequences holding a slot fill now: the prompt written so far
        and the tokens decoded since."""
        return sum(
            seq.group.prefilled + max(0, seq.n_out - 1)
            for seq in self._seqs.values()
            if seq.slot >= 0
        )

    def steps_until_a_slot_frees(self) -> int:
        """Upper bound on the steps before some slot is free (0 when one is free): a slot
        whose group has choices waiting frees only after they ran too."""
        if self.running < self.served_slots:
            return 0
        best = None
        for seq in self._seqs.values():
            if seq.slot < 0:
                continue
            group = seq.group
            chunks_left = -(-(len(group.prompt) - group.prefilled) // self.prefill_chunk)
            tokens_left = min(
                group.max_tokens - seq.n_out,
                self.context_window - len(group.prompt) - max(seq.n_out - 1, 0),
            )
            steps = chunks_left + max(tokens_left, 1)
            live = [s for s in group.seqs if not s.done]
            waiting = sum(s.slot < 0 for s in live)
            if waiting:  # they take the group's slots in turn
                turns = -(-waiting // (len(live) - waiting))
                per_choice = min(group.max_tokens, self.context_window - len(group.prompt))
                steps += turns * max(per_choice, 1)
            best = steps if best is None else min(best, steps)
        return best or 1

    def steps_until_admitted(self) -> int:
        """Steps before a request arriving now would likely hold a slot: until the first
        slot frees (steps_until_a_slot_frees), then one turnover of the served slots for
        every `served_slots` requests already queued ahead of it. A turnover is what a
        sequence measurably takes (the mean over the ones that finished), at least the
        steps until the first slot frees."""
        first = self.steps_until_a_slot_frees()
        ahead = len(self._waiting)
        if not ahead:
            return first
        rounds = -(-ahead // self.served_slots)
        turnover = max(first, 1, round(self.mean_sequence_steps))
        return first + rounds * turnover

    # --- internals -----------------------------------------------------------------------

    def _queued_behind(self, need: int) -> int:
        """How many groups would wait ahead of a new one needing `need` slots, plus one if
        it would have to wait itself (0: it starts at the next step)."""
        free = self.lane.free_for_interactive(self)  # batch groups park for it
        waiting = 0
        for group in self._waiting:
            g_need = min(group.n, self.served_slots)
            if waiting == 0 and g_need <= free:
                free -= g_need
            else:
                waiting += 1
        return waiting + (0 if waiting == 0 and need <= free else 1)

    def _take_slot(self, group: _Group | None) -> int:
        if group is None or self.choose_slot is None:
            return heapq.heappop(self._free)
        slot = self.choose_slot(group.prompt, list(self._free), group.namespace, group.session)
        self._free.remove(slot)
        heapq.heapify(self._free)
        return slot

    def _position(self, seq: _Seq) -> int:
        """Where the sequence's next decoded token (its last sampled one) goes in the KV."""
        return len(seq.group.prompt) + seq.n_out - 1

    def _finish(self, seq: _Seq, reason: str, fed_last: bool = False) -> Finished:
        """`fed_last`: the sequence's last output token was fed back (it ended on an end
        of turn sampled after it), so its KV is written too."""
        slot = seq.slot
        seq.done = True
        self._hand_on(seq)
        self._release(seq)
        group = seq.group
        done = all(s.done for s in group.seqs)
        if done:
            self._running.pop(group.group_id, None)
        kv_used = min(len(group.prompt) + seq.n_out, self.context_window)
        self._measure(group, seq)
        return Finished(
            group_id=group.group_id,
            seq_id=seq.seq_id,
            index=seq.index,
            reason=reason,
            prompt_tokens=len(group.prompt),
            completion_tokens=seq.n_out,
            kv_used=kv_used,
            kv_cap=self.context_window,
            choices=group.n,
            group_done=done,
            cached_tokens=group.cached,
            kv_written=len(group.prompt) + max(0, seq.n_out - (0 if fed_last else 1)),
            slot=slot,
        )

    def _measure(self, group: _Group, seq: _Seq) -> None:
        """The running mean of a finished sequence's steps (its prefill chunks and its
        tokens), for steps_until_admitted."""
        steps = -(-(len(group.prompt) - group.cached) // self.prefill_chunk) + seq.n_out
        self._finished_sequences += 1
        weight = max(1 / self._finished_sequences, 0.1)  # the mean, then the recent ones
        self.mean_sequence_steps += weight * (steps - self.mean_sequence_steps)

    def _hand_on(self, seq: _Seq) -> None:
        """A finished sequence's slot goes to its group's next waiting choice, if any (not
        while more slots are held than served, unless it is the group's last one)."""
        if seq.slot < 0:
            return
        live = [s for s in seq.group.seqs if not s.done]
        heir = next((s for s in live if s.slot < 0), None)
        if heir is None:
            return
        if self.running > self.served_slots and any(s.slot >= 0 for s in live):
            return
        heir.slot, seq.slot = seq.slot, -1

    def _release(self, seq: _Seq) -> None:
        self._seqs.pop(seq.seq_id, None)
        if seq.slot >= 0:
            heapq.heappush(self._free, seq.slot)
            self._freed.append(seq.slot)
            seq.slot = -1
        group = seq.group
        if all(s.done for s in group.seqs):
            self._running.pop(group.group_id, None)


def _no_room(group: _Group) -> str:
    return (
        f"memory pressure: the prompt ({len(group.prompt)} tokens) no longer fits the "
        "context window; retry later"
    )
