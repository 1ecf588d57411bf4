"""What a free KV slot still holds, so that the next prompt sharing its beginning resumes
there instead of computing it again (the prefix cache), and a session's next turn lands
in the slot its last turn parked from without copying the parked prefix back.

A sequence that ends leaves its KV in its slot: the prompt and every output token fed
back. Instead of handing those pages back to the OS at once, the slot is kept with the
tokens it holds, and admission gives a new request the free slot whose tokens share the
longest beginning with its prompt (a chat's system prompt and template, an agent's next
call with the same history, the same question asked again). The KV of a token depends
only on the tokens before it, so those positions are the prompt's own; the engine starts
the prefill after them and reports them as `cached_tokens`. llama.cpp's server does the
same per slot (`cache_prompt`).

Bounds: a kept slot is released (its pages handed back) after KEEP_S unused, when the
kept positions pass `max_positions` (oldest first), or, for a session's parked
conversation, beyond `max_parked` slots or once that conversation is gone from the
session table (a released session leaves nothing behind). Kept tokens are reused only by
requests of the namespace (API key) that wrote them. Engine thread only.

Host memory behind the slots (`max_spill_bytes`, PANTHEON_PREFIX_CACHE_RAM_MB): when
admission overwrites a kept slot with an unrelated prompt, what it held is first copied
out (`spill_source`, saved by the service) into a byte-bounded store, least recently
spilled dropped first, SPILL_KEEP_S at most; a later prompt that such a copy continues
further than any slot gets it loaded back into its slot (`restore_source`) instead of
computing it again. More conversations than slots (many users of one chat app, an agent
fanning out) then stop recomputing each other's prefixes; llama.cpp's server has the same
(`--cache-ram`). A session's parked conversation is not spilled: it gets its own copy.

A session's conversation may still live in the slot it was parked from (conversation.py:
parked lazily): whenever a slot stops keeping what it holds (taken by a new sequence,
handed on, past the bounds, cleared), that conversation is first moved out to host
memory (`Conversation.move_out`), before anyone writes the slot or hands its pages back.
"""

from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

# A free slot keeps its KV this long for a prompt (or a session turn) that continues it.
KEEP_S = 60.0
# A prefix spilled to host memory is kept at most this long.
SPILL_KEEP_S = 600.0
# Shorter prefixes are not worth a copy out and back (a template's first tokens).
MIN_SPILL_TOKENS = 16


@dataclass
class _Kept:
    tokens: tuple[int, ...]
    since: float
    namespace: str = ""  # whose request wrote them (GenerationRequest.cache_namespace)
    parked: weakref.ref | None = None  # the session conversation these tokens are
    session: str | None = None  # ... and the session id whose turn parked it

    @property
    def gone(self) -> bool:
        """A session conversation's copy whose conversation is gone (released, expired,
        evicted): the session's KV goes with it."""
        return self.parked is not None and self.parked() is None

    def let_go(self, spare=None) -> None:
        """The slot stops keeping these tokens: a session conversation still living in it
        moves to host memory first (before the slot is written or released), unless it
        is `spare` (the turn taking the slot continues it: SlotContents.pin)."""
        _move_out(self.parked, spare)


@dataclass(eq=False)
class Spilled:
    """A kept slot's KV copied to host memory: (n_layer, n_kv_head, n, head_dim) each
    (None until the service has saved it)."""

    tokens: tuple[int, ...]
    namespace: str
    k: Any
    v: Any
    since: float
    claimed: bool = False  # a restore took it before it was saved

    @property
    def nbytes(self) -> int:
        return int(self.k.nbytes + self.v.nbytes) if self.k is not None else 0


def common_prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    """How many leading tokens `a` and `b` share."""
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        return n
    lo, hi = 0, n  # a[:lo] == b[:lo], a[:hi] != b[:hi]
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid
    return lo


class SlotContents:
    def __init__(
        self, max_positions: int, max_parked: int, share: bool = True, max_spill_bytes: int = 0
    ):
        # share=False: only a session's own next turn lands in the slot it parked from;
        # nothing is copied for other prompts (ModelConfig.prefix_cache).
        self.share = share
        self.max_positions = max_positions
        self.max_parked = max(1, max_parked)
        self.max_spill_bytes = max_spill_bytes if share else 0
        self._spilled: list[Spilled] = []  # oldest first
        # Chosen this admission: slot -> what it holds, to copy out before it is overwritten;
        # slot -> (a spilled prefix, positions) to load into it.
        self._spill_from: dict[int, Spilled] = {}
        self._restores: dict[int, tuple[Spilled, int]] = {}
        self._kept: dict[int, _Kept] = {}
        # Sequences that ended this step, by slot: what the slot holds once it is freed
        # (a slot handed on to a waiting choice of the same request is not freed).
        self._ended: dict[int, _Kept] = {}
        # Chosen this admission: slot -> (the slot to copy its prompt's first n positions
        # from, n), so that a longer kept conversation is not overwritten for its prefix.
        self._copies: dict[int, tuple[int, int]] = {}
        # slot -> session conversations whose first positions live on in it while a turn
        # continuing them runs there (pin); out to host memory when the slot is let go.
        self._pinned: dict[int, list[weakref.ref]] = {}

    # --- as sequences end and slots free ----------------------------------------------

    def ended(
        self,
        slot: int,
        tokens: tuple[int, ...],
        now: float,
        namespace: str = "",
        parked=None,
        session: str | None = None,
    ) -> None:
        """A sequence of `namespace` ended in `slot` with `tokens` written (`parked`: the
        session conversation made of them, parked by `session`'s turn)."""
        ref = weakref.ref(parked) if parked is not None else None
        _let_go(self._ended.get(slot))
        self._ended[slot] = _Kept(tuple(tokens), now, namespace, ref, session)
        if parked is not None:
            self._past_parked_bound()

    def _past_parked_bound(self) -> None:
        """A conversation just parked: those it pushes past `max_parked` are released at
        the next freed(); they move out now, as the turn that parked it ends (when an
        eager park copied), not during the next request's first token."""
        live = [
            k
            for k in (*self._kept.values(), *self._ended.values())
            if k.parked is not None and not k.gone
        ]
        live.sort(key=lambda kept: -kept.since)
        for kept in live[self.max_parked :]:
            kept.let_go()

    def freed(self, slots: list[int], now: float) -> list[int]:
        """Slots freed this step: those to release now (nothing to keep); the rest are
        kept. Then the bounds, applied oldest first."""
        release = []
        for slot in slots:
            kept = self._ended.pop(slot, None)
            before = self._kept.pop(slot, None)
            if before is not None and (kept is None or kept.parked != before.parked):
                before.let_go()
            if kept is not None and kept.tokens:
                self._kept[slot] = kept
            else:
                _let_go(kept)
                self._unpin(slot)
                release.append(slot)
        for kept in self._ended.values():  # ended in a slot handed on: that slot decodes on
            kept.let_go()
        self._ended.clear()
        return release + self._over_bounds(now)

    def _over_bounds(self, now: float) -> list[int]:
        out = []
        positions = parked = 0
        for slot, kept in sorted(self._kept.items(), key=lambda item: -item[1].since):
            is_parked = kept.parked is not None and not kept.gone
            positions += len(kept.tokens)
            parked += is_parked
            if (
                kept.gone
                or now - kept.since > KEEP_S
                or positions > self.max_positions
                or (is_parked and parked > self.max_parked)
            ):
                out.append(slot)
        for slot in out:
            self._kept.pop(slot).let_go()
            self._unpin(slot)
        self._spilled = [e for e in self._spilled if now - e.since <= SPILL_KEEP_S]
        return out

    def taken(self, slots, spare=None) -> None:
        """These slots are in use again: what they held is being overwritten (`spare`: a
        session conversation the new turn continues, pinned by the caller)."""
        self.let_go(slots, spare)
        for slot in slots:
            self._kept.pop(slot, None)
            self._ended.pop(slot, None)
            self._copies.pop(slot, None)
            self._spill_from.pop(slot, None)
            self._restores.pop(slot, None)

    def clear(self) -> list[int]:
        """Forget everything kept (host-memory copies too); the slots to release."""
        for kept in (*self._kept.values(), *self._ended.values()):
            kept.let_go()
        for slot in list(self._pinned):
            self._unpin(slot)
        slots = list(self._kept)
        self._kept.clear()
        self._ended.clear()
        self._copies.clear()
        self._spilled.clear()
        self._spill_from.clear()
        self._restores.clear()
        return slots

    def let_go(self, slots, spare=None, still_read: dict[int, int] | None = None) -> None:
        """These slots are about to be written (admission chose them): the session
        conversations still living there move to host memory first, but `spare`.
        `still_read`: slot -> how many of its first positions are read in place after
        this; past them the slot is overwritten, so the last conversation to leave it
        (the longest: the others hold a prefix of it) takes its pages rather than a copy
        (Conversation.move_out), unless a spill of the slot still has to read them."""
        for slot in slots:
            held = [self._kept.get(slot), self._ended.get(slot)]
            refs = [kept.parked for kept in held if kept is not None and kept.parked is not None]
            living = {id(c): c for c in (ref() for ref in [*refs, *self._pinned.get(slot, ())])}
            leaving = sorted(
                (
                    c
                    for c in living.values()
                    if c is not None and c is not spare and c.resident_slot == slot
                ),
                key=lambda conv: conv.in_slot,
            )
            keep = None if still_read is None or slot in self._spill_from else still_read.get(slot)
            for i, conv in enumerate(leaving):
                conv.move_out(keep if i == len(leaving) - 1 else None)
            self._unpin(slot, spare)  # what is left: the bookkeeping

    def pin(self, slot: int, conv) -> None:
        """`conv`'s first positions live on in `slot`, which a turn continuing it now
        uses (Conversation.keep_prefix moved the rest out): moved out when it is let go."""
        pinned = self._pinned.setdefault(slot, [])
        if conv.resident_slot == slot and all(ref() is not conv for ref in pinned):
            pinned.append(weakref.ref(conv))

    def _unpin(self, slot: int, spare=None) -> None:
        for ref in self._pinned.pop(slot, ()):
            if ref() is spare and spare is not None:
                self._pinned.setdefault(slot, []).append(ref)
            else:
                _move_out(ref, None)

    def restoring(self, slot: int) -> bool:
        """Whether admission will copy a prefix into `slot` (copy_source, restore_source)."""
        return slot in self._copies or slot in self._restores

    # --- host memory -------------------------------------------------------------------

    def spill_source(self, slot: int) -> Spilled | None:
        """What `slot` holds, when admission is about to overwrite it and it is worth a copy
        in host memory: the service fills in its k and v (`kv.save`), then `spilled()`."""
        return self._spill_from.pop(slot, None)

    def make_spill_room(self, entry: Spilled, n_bytes: int) -> None:
        """Before `entry` is saved (n_bytes): the store's oldest entries go now, not after
        the copy, so that the copy writes the host memory they held (host_buffers.py)
        rather than fresh pages, and the two are never held at once. Nothing goes for an
        entry that will not be stored (claimed, or over the bound by itself)."""
        if entry.claimed or n_bytes > self.max_spill_bytes:
            return
        total = sum(e.nbytes for e in self._spilled if not _same(e, entry))
        while self._spilled and total + n_bytes > self.max_spill_bytes:
            dropped = self._spilled.pop(0)
            if not _same(dropped, entry):
                total -= dropped.nbytes

    def spilled(self, entry: Spilled, now: float) -> None:
        """`entry` saved: into the store, unless a prompt admitted in the same step already
        claimed it (it goes straight back into that prompt's slot)."""
        entry.since = now
        if entry.claimed or entry.nbytes > self.max_spill_bytes:
            return
        self._spilled = [e for e in self._spilled if not _same(e, entry)]
        self.make_spill_room(entry, entry.nbytes)  # least recently spilled first
        self._spilled.append(entry)

    def spilled_bytes(self) -> int:
        return sum(e.nbytes for e in self._spilled)

    def restore_source(self, slot: int) -> tuple[Spilled, int] | None:
        """(a spilled prefix, positions) to load into `slot` before its prefill, once; None
        when its copy never happened (the group that displaced it went away first)."""
        restore = self._restores.pop(slot, None)
        return restore if restore is not None and restore[0].k is not None else None

    def _best_spilled(self, prompt, namespace: str) -> tuple[Spilled | None, int]:
        # Copies pending this step count too: eight requests arriving together for eight
        # conversations, one of them displaced by another's restore, all resume.
        pending = [e for e in self._spill_from.values() if not e.claimed]
        best, best_n = None, 0
        for entry in (*self._spilled, *pending):
            if entry.namespace == namespace:
                n = common_prefix(entry.tokens, prompt)
                if n > best_n:
                    best, best_n = entry, n
        return best, best_n

    def _claim(self, entry: Spilled) -> None:
        if entry in self._spilled:
            self._spilled.remove(entry)  # back into a slot: kept there from now on
        else:
            entry.claimed = True  # still to be saved this step, then loaded, not stored

    def _evicting(self, slot: int) -> None:
        """Admission overwrites `slot`: copy out what it keeps first, if worth it."""
        kept = self._held(slot)
        if (
            kept is not None
            and self.max_spill_bytes > 0
            and kept.parked is None  # a session's conversation has its own copy
            and len(kept.tokens) >= MIN_SPILL_TOKENS
        ):
            self._spill_from[slot] = Spilled(kept.tokens, kept.namespace, None, None, kept.since)

    # --- admission ---------------------------------------------------------------------

    def prefer(
        self,
        prompt: tuple[int, ...],
        free: list[int],
        namespace: str = "",
        session: str | None = None,
    ) -> int | None:
        """The free slot for a prompt's first sequence. The one whose kept tokens (of the
        same namespace) share the longest beginning with it, when the prompt continues
        all of them; when that slot holds more than the shared part (another conversation
        with the same system prompt), the shared positions are copied into another free
        slot (`copy_source`) and the longer one stays. Otherwise an empty slot (the
        lowest), so that kept prefixes survive, else the least recently kept. A turn of
        `session` whose own parked conversation that slot holds continues it there
        instead, when the tail it overwrites is no longer than what it keeps: the tail
        moves out (Conversation.keep_prefix), not the whole shared part to another slot
        (a 2.5k-token history: 125 MB copied before the first token)."""
        best, best_n, whole, whole_n = -1, 0, -1, 0
        for slot in free:
            n = self.reusable(slot, prompt, namespace)
            if n > best_n:
                best, best_n = slot, n
            if n > whole_n and n == len(self._held(slot).tokens):
                whole, whole_n = slot, n  # the prompt continues all it holds
        spilled, spilled_n = self._best_spilled(prompt, namespace)
        if whole >= 0 and (whole_n >= max(best_n, spilled_n) or not self.share):
            return whole
        if best >= 0 and best_n >= spilled_n and self._continues_own(best, best_n, session):
            return best
        if spilled_n > best_n:  # host memory holds more of it than any slot
            best, best_n = -1, 0
        others = [slot for slot in free if slot != best]
        empty = [slot for slot in others if self._held(slot) is None]
        victim = min(empty) if empty else self._least_recent(others)
        if best >= 0:
            if best == whole:
                return best
            if victim is None:  # the only free slot: its longer conversation goes
                self._evicting(best)
                return best
            if self.share:
                self._copies[victim] = (best, best_n)
        if victim is not None:
            self._evicting(victim)
            if spilled is not None and spilled_n > best_n:
                self._claim(spilled)
                self._restores[victim] = (spilled, spilled_n)
        return victim

    def _continues_own(self, slot: int, shared: int, session: str | None) -> bool:
        kept = self._held(slot)
        return (
            session is not None
            and kept.parked is not None
            and kept.session == session
            and len(kept.tokens) - shared <= shared
        )

    def _least_recent(self, slots: list[int]) -> int | None:
        return min(slots, key=lambda slot: self._held(slot).since) if slots else None

    def copy_source(self, slot: int) -> tuple[int, int] | None:
        """(source slot, positions) to copy into `slot` before its prefill, once: what
        prefer() chose for it."""
        return self._copies.pop(slot, None)

    def copies_from(self, slot: int) -> int:
        """Positions of `slot` that copies chosen this admission, not yet made, still read
        (0: none)."""
        return max((n for src, n in self._copies.values() if src == slot), default=0)

    def reusable(self, slot: int, prompt: tuple[int, ...], namespace: str = "") -> int:
        """Positions of `prompt` that `slot`'s kept KV already holds for `namespace`."""
        kept = self._held(slot)
        if kept is None or kept.namespace != namespace or kept.gone:
            return 0
        return common_prefix(kept.tokens, prompt)

    def held_tokens(self, slot: int) -> tuple[int, ...]:
        """The tokens whose KV `slot` keeps (empty: none)."""
        kept = self._held(slot)
        return kept.tokens if kept is not None else ()

    def kept_positions(self, slot: int) -> int:
        """How many positions of `slot` the cache keeps (0: none, or the slot is in use)."""
        kept = self._kept.get(slot)
        return len(kept.tokens) if kept is not None else 0

    def parked_conversation(self, slot: int):
        """The session conversation whose KV `slot` holds, or None."""
        kept = self._held(slot)
        return kept.parked() if kept is not None and kept.parked is not None else None

    def _held(self, slot: int) -> _Kept | None:
        # A slot freed in the step before is admitted from before freed() has run.
        return self._kept.get(slot) or self._ended.get(slot)

    def __len__(self) -> int:
        return len(self._kept)


def _let_go(kept: _Kept | None, spare=None) -> None:
    if kept is not None:
        kept.let_go(spare)


def _move_out(ref: weakref.ref | None, spare) -> None:
    conv = ref() if ref is not None else None
    if conv is not None and conv is not spare:
        conv.move_out()


def _same(a: Spilled, b: Spilled) -> bool:
    return a.namespace == b.namespace and a.tokens == b.tokens
