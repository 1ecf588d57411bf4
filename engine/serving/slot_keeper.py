"""The KV copies that follow from what free slots keep (slot_cache.py's bookkeeping): a
prompt resumed from a session's parked conversation, a prefix another slot holds, or one
spilled to host memory; a finished choice's KV kept for the prefix cache or parked as its
session's newest conversation (left in its slot where the KV cache allows: conversation.py,
moved out by slot_cache.py before the slot is reused); freed slots' pages handed back.
Engine thread only."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from .batch import Finished, Started
from .conversation import Conversation
from .sessions import Resume, SessionTable
from .slot_cache import SlotContents, common_prefix

if TYPE_CHECKING:
    from .records import EngineRequest

# Positions past a request's prompt and max_tokens that a verify pass may still write
# (its drafts: speculation.prediction_draft of the default 7, rounded up).
WRITE_MARGIN = 16


class SlotKeeper:
    def __init__(self, kv, contents: SlotContents, sessions: SessionTable, prefix_cache: bool):
        self.kv = kv
        self.slot_contents = contents
        self.sessions = sessions
        self.prefix_cache = prefix_cache  # the load option: prompts may share kept prefixes
        # seq id -> (k, v, positions): parked batch sequences' KV (priority.py)
        self.parked: dict[int, tuple] = {}

    def move_parked(self, moves) -> None:
        """Batch sequences parked for interactive ones (priority.Moves): their written KV
        out of the slot, dropped once they are gone, back into a new slot."""
        for seq_id, slot, positions in moves.park:
            self.parked[seq_id] = (*self.kv.save(slot, positions), positions)
        for seq_id in moves.drop:
            self.parked.pop(seq_id, None)
        for seq_id, slot in moves.unpark:
            k, v, positions = self.parked.pop(seq_id)
            self.slot_contents.taken([slot])  # whatever it kept is overwritten (moved out first)
            self.kv.load(slot, k, v, positions)

    def clear(self) -> int:
        """Forget every kept prefix and hand its pages back; the number of slots released."""
        slots = self.slot_contents.clear()
        for slot in slots:
            self.kv.release(slot)
        return len(slots)

    def resume_prefixes(
        self, resuming: list[tuple[Started, EngineRequest | None]], moves=None
    ) -> list[tuple[int, int]]:
        """Groups just admitted whose prompt begins with KV that exists already: a session
        turn's conversation (copied into the group's first slot unless that slot still
        holds it) and whatever that slot itself still holds (the prefix cache), whichever
        covers more. Returns (group id, cached tokens) to resume."""
        if moves:  # batch sequences parked first: before anything writes their slots
            self.move_parked(moves)
        resumed = []
        for started, req in resuming:
            copy = self.slot_contents.copy_source(started.slots[0]) if started.slots else None
            if req is None or not started.slots:
                self.slot_contents.taken(started.slots)
                continue
            slot, prompt = started.slots[0], req.request.prompt_ids
            sid = req.request.session_id
            if sid is not None and self.sessions.enabled:
                req.resume = self.sessions.match(sid, prompt)
            conv = req.resume.conversation if req.resume is not None else None
            # A session conversation living in one of these slots moves out before any
            # write, but the one this turn continues in its own slot (nothing is copied
            # into it first): only what the turn overwrites moves (keep_prefix below).
            spare = conv if copy is None and self._continues_here(conv, slot) else None
            # What the slot holds moves out (a session's conversation here, a spill below)
            # by taking its pages past what is still read in place, not by a copy: a 3k-
            # token slot's copy was 65-85 ms of an admission step while every stream waited.
            keep = self._still_read(slot, self.slot_contents.held_tokens(slot), prompt, spare)
            self.slot_contents.let_go(started.slots, spare, still_read={slot: keep})
            spill = self.slot_contents.spill_source(slot)
            if spill is not None:  # what the slot kept, to host memory before it is overwritten
                n_bytes = len(spill.tokens) * self.kv.bytes_per_token()
                self.slot_contents.make_spill_room(spill, n_bytes)
                spill.k, spill.v = self.kv.take(slot, len(spill.tokens), keep)
                self.slot_contents.spilled(spill, time.monotonic())
            cached = 0
            if copy is not None:  # a kept prefix another conversation's slot also holds
                source, cached = copy
                self.kv.copy_prefix(source, slot, cached)
            restore = self.slot_contents.restore_source(slot)
            if restore is not None:  # a prefix spilled to host memory earlier
                entry, n = restore
                self.kv.load(slot, entry.k, entry.v, n)
                cached = max(cached, n)
            if conv is not None and req.resume.cached > cached:
                resumed_n = req.resume.cached
                in_place = conv.resident_slot == slot and conv.in_slot >= resumed_n
                if self.slot_contents.parked_conversation(slot) is not conv and not in_place:
                    self._load(slot, conv, resumed_n)
                cached = resumed_n
            # Positions the slot holds for this prompt stay valid past a copy into it:
            # the copy wrote the same tokens' KV over the first of them.
            if self.prefix_cache:
                namespace = req.request.cache_namespace
                cached = max(cached, self.slot_contents.reusable(slot, prompt, namespace))
            if cached > 0:
                resumed.append((started.group_id, cached))
            if spare is not None:  # the turn writes from where it resumes (Scheduler.resume)
                spare.keep_prefix(min(cached, len(prompt) - 1))
            # What the slots held past the resumed positions has moved out (spilled, parked)
            # or is dead: its pages go back now, not when this request ends, so a displaced
            # conversation is not held twice (in its host copy and in the slot) meanwhile.
            # Not the pages this request may write itself (its prompt, its max_tokens, a
            # verify pass's drafts): each (layer, head) run is a madvise with a TLB
            # shootdown, and each page a fault back (8 cached chat requests at once: ~15 ms
            # of admission for nothing).
            reach = len(prompt) + req.request.params.max_tokens + WRITE_MARGIN
            self.kv.release(slot, keep=max(cached, reach))
            for other in started.slots[1:]:
                self.kv.release(other, keep=reach)
            self.slot_contents.taken(started.slots, spare)  # overwritten from now on
            if spare is not None:
                self.slot_contents.pin(slot, spare)
        return resumed

    def _still_read(self, slot: int, held: tuple[int, ...], prompt, spare) -> int:
        """Positions of `slot` (holding `held`) still read in place once what it holds has
        moved out: the prompt's own prefix of them (the prefix cache resumes there), a
        copy into another slot not made yet, a conversation continued in the slot."""
        keep = common_prefix(held, prompt) if self.prefix_cache else 0
        keep = max(keep, self.slot_contents.copies_from(slot))
        return max(keep, spare.in_slot) if spare is not None else keep

    def _continues_here(self, conv: Conversation | None, slot: int) -> bool:
        """Whether the turn admitted into `slot` continues `conv` living in that slot, with
        nothing copied into the slot before its prefill."""
        return (
            conv is not None
            and conv.resident_slot == slot
            and not self.slot_contents.restoring(slot)
        )

    def _load(self, slot: int, conv: Conversation, n: int) -> None:
        """The first `n` positions of a session's conversation into `slot`: from the slot
        they still live in, else from its host copy (the same stored rows either way)."""
        source = conv.resident_slot
        if source is not None and n <= conv.in_slot:
            self.kv.copy_prefix(source, slot, n)
        else:
            self.kv.load(slot, conv.k, conv.v, n)

    def release_freed(self, freed: list[int]) -> None:
        """Hand back the KV pages of freed slots that hold nothing worth keeping, and of
        kept ones past the bounds (slot_cache); of a slot kept, the pages past what it
        keeps (an earlier, longer sequence's positions, read by no one)."""
        for slot in self.slot_contents.freed(freed, time.monotonic()):
            self.kv.release(slot)
        for slot in freed:
            kept = self.slot_contents.kept_positions(slot)
            if kept:
                self.kv.release(slot, keep=kept)

    def keep_finished(
        self, req: EngineRequest, index: int, token_ids: list[int], event: Finished
    ) -> bool:
        """A choice ended: note what its slot holds (still intact: the slot is reused only
        at the next step) for the prefix cache; for choice 0 of a session turn, keep that
        KV as the session's newest conversation (left in the slot, where the KV cache
        allows, until the slot is needed). Returns the session_conflict flag."""
        request = req.request
        n_out = event.kv_written - len(request.prompt_ids)
        tokens = (*request.prompt_ids, *token_ids[:n_out])
        if n_out < 0 or len(tokens) != event.kv_written or event.slot < 0:
            return False
        now = time.monotonic()
        if index != 0 or request.session_id is None or not self.sessions.enabled:
            if self.prefix_cache:
                self.slot_contents.ended(event.slot, tokens, now, request.cache_namespace)
            return False
        conversation = Conversation.parked_from(tokens, self.kv, event.slot)
        # Parked first, and the request lets go of the conversation it resumed from: one
        # this replaces goes at once, not copied out of its slot for no one (past the
        # parked bound, ended() moves the older ones out).
        resumed, req.resume = req.resume, Resume()
        conflict = self.sessions.park(request.session_id, conversation, resumed)
        del resumed
        self.slot_contents.ended(
            event.slot,
            tokens,
            now,
            request.cache_namespace,
            parked=conversation,
            session=request.session_id,
        )
        return conflict
