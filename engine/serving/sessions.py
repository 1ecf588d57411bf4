"""The session table: a model's prefix cache, keyed by session id within a namespace.

Namespaces: every session belongs to the namespace of the caller that made it (the
caller's API key: "key:<console key id>", "env:client", "env:admin"; "open" on a server
with no key). A `SessionKey` is the session id together with its namespace, built in one
place (sessions.tenancy, from what the access guard put in the request's scope); a plain
str is an id in the OPEN namespace (an open server, engine tests). The same id in two
namespaces is two sessions: no turn, release, watch or restore reaches another
namespace's session, and a turn's `cached_tokens` only ever counts its own namespace's
KV. Each namespace but OPEN may hold at most `key_max_sessions` ids and
`key_max_watches` watches, so one key cannot take every slot from the others. A cap left
at its default (0: half the table's) applies only while `several_keys()` says more than
one key could hold sessions (the server sets it: sessions.tenancy), so the only key of a
single-user server may use every slot; a cap set explicitly always applies. A capped
key's watches are further held to the watch table's share per key (`key_holders()`), so
the keys together cannot fill the watch table.

A session id owns up to MAX_CONVERSATIONS conversations (a client may send its title
request and its real turns under one id). Each conversation is the token history whose
KV is held, plus that KV (conversation.py): arrays (n_layer, n_kv_head, n_tok, head_dim),
parked here between turns. A turn copies the KV of the conversation its prompt continues
into its slot (none when it lands in the slot that conversation still lives in) and
prefills only the rest (delta prefill); when the turn ends, its KV becomes the id's
newest conversation, left in its slot until that slot is needed (conversation.py).

Conversations are immutable once parked (a turn replaces one, never edits it), so an
export can serialize one outside the lock while the engine keeps running.

Residency: `max_sessions` counts ids. A new id while every one is held, or while its
namespace holds its own cap, is refused (SessionCapacity); an idle id is dropped after
`idle_ttl_s`; an id with a watch held is never dropped, and once its last watch is gone it
is dropped after `watch_grace_s` unless a new watch arrives first.

Implicit sessions (an id the server chose, not the client: the Responses API's chain) are
a cache and nothing more: idle, one is dropped after `implicit_ttl_s`; it takes only a
free slot (in the table and in its namespace: its own key's cap); a new explicit id that
finds no free slot evicts implicit ones first, least recently used, idle before busy, so
no key's implicit state makes anyone's explicit session wait; and `durable` leaves it
out of what is written to disk. An explicit turn on an implicit id, or a restore into
it, makes it explicit.

Matching: a turn resumes from the conversation sharing the longest token prefix with its
prompt (at least one prompt token is always computed, for the logits). When the turn
ends, its history replaces that conversation if the shared prefix covered at least half
of it (the next turn, a regenerated or edited last turn); otherwise it is a different
conversation and is added, displacing the id's least recently used one when the id holds
MAX_CONVERSATIONS: such a turn reports `session_conflict`.

Changes: `listener` (if set) is called with the SessionKey after a turn parks a
conversation, a restore installs one, or the id is released or reaped; it runs on the
caller's thread (the engine thread for parks and reaps), so it must only take note (the
sessions app queues a background write to disk).

Pure bookkeeping plus array references: no model, no KV cache. Thread safe.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

from ..types import SessionBusy, SessionCapacity, SessionNotFound, WatchUnavailable
from .conversation import Conversation
from .session_key import OPEN, SessionKey

MAX_CONVERSATIONS = 4


@dataclass(frozen=True)
class Resume:
    """Where a turn starts: the conversation it continues and how many of its prompt
    tokens come from that conversation's KV (0: a cold turn)."""

    conversation: Conversation | None = None
    shared: int = 0  # tokens the prompt shares with the conversation
    cached: int = 0  # of those, reused (at most len(prompt) - 1)


@dataclass(frozen=True)
class SessionInfo:
    session_id: SessionKey  # its namespace is `namespace`
    conversations: int
    tokens: int  # held by the most recently used conversation
    total_tokens: int
    kv_bytes: int
    created: float
    last_used: float
    in_flight: int
    watches: int
    namespace: str = OPEN
    implicit: bool = False


@dataclass(eq=False)
class _Session:
    session_id: SessionKey
    created: float
    last_used: float
    conversations: list[Conversation] = field(default_factory=list)  # least recent first
    in_flight: int = 0
    idle_ttl_s: float | None = None  # this id's own idle TTL (Ollama keep_alive); None: the table's
    implicit: bool = False  # the server chose the id: a cache evicted first, never on disk


def shared_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Length of the common prefix of two token sequences."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    x = np.asarray(a[:n], dtype=np.int64)
    y = np.asarray(b[:n], dtype=np.int64)
    diff = np.flatnonzero(x != y)
    return int(diff[0]) if diff.size else n


def _furthest(conversations: Sequence[Conversation], tokens: Sequence[int]) -> Resume:
    """The conversation sharing the longest prefix with `tokens` (all of it reusable)."""
    best = Resume()
    for conv in conversations:
        shared = shared_prefix(conv.tokens, tokens)
        if shared > best.shared:
            best = Resume(conv, shared, shared)
    return best


class SessionTable:
    def __init__(
        self,
        max_sessions: int,
        *,
        idle_ttl_s: float = 12 * 3600.0,
        watch_grace_s: float = 45.0,
        max_watches: int = 64,
        key_max_sessions: int = 0,
        key_max_watches: int = 0,
        implicit_ttl_s: float = 300.0,
        clock: Callable[[], float] = time.time,
    ):
        self.max_sessions = max_sessions
        self.idle_ttl_s = idle_ttl_s
        self.implicit_ttl_s = implicit_ttl_s
        self.watch_grace_s = watch_grace_s
        self.max_watches = max_watches
        # Per namespace (every one but OPEN); 0: half the table's, at least 1, and only
        # while several keys could hold sessions (`several_keys`); a setting > 0 always.
        self.key_max_sessions = min(max_sessions, key_max_sessions or max(1, max_sessions // 2))
        self.key_max_watches = min(max_watches, key_max_watches or max(1, max_watches // 2))
        self._sessions_cap_set = key_max_sessions > 0
        self._watches_cap_set = key_max_watches > 0
        # Whether more than one key could hold sessions on this server: called under the
        # lock, so it must not block (sessions.tenancy.several_keys reads a cached count).
        # None (an engine without a server): assume several, the safe side.
        self.several_keys: Callable[[], bool] | None = None
        # How many keys could hold watches (None: not known yet): the watch cap divides
        # the watch table among them (`_watch_cap_locked`). Also non-blocking.
        self.key_holders: Callable[[], int | None] | None = None
        self.clock = clock
        self.listener: Callable[[SessionKey], None] | None = None
        self._lock = threading.Lock()
        self._sessions: dict[SessionKey, _Session] = {}
        self._watches: dict[SessionKey, int] = {}  # watches held per key
        self._grace: dict[SessionKey, float] = {}  # key -> when its unwatched grace ends

    @property
    def enabled(self) -> bool:
        return self.max_sessions > 0

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    def __contains__(self, session_id: str) -> bool:
        with self._lock:
            return SessionKey.of(session_id) in self._sessions

    # --- turns ---------------------------------------------------------------------------

    def begin_turn(self, session_id: str, *, implicit: bool = False) -> None:
        """A turn of `session_id` is admitted; a new id needs a free session slot (in the
        table and in its namespace; an explicit one evicts implicit sessions to get it).
        `implicit`: the server chose the id; an explicit turn makes an implicit id explicit."""
        key = SessionKey.of(session_id)
        with self._lock:
            session = self._sessions.get(key)
            evicted = []
            if session is None:
                session, evicted = self._new_locked(key, implicit)
            elif not implicit:
                session.implicit = False
            session.in_flight += 1
            session.last_used = self.clock()
        for victim in evicted:
            self._changed(victim)

    def end_turn(self, session_id: str) -> None:
        key = SessionKey.of(session_id)
        with self._lock:
            session = self._sessions.get(key)
            if session is not None:
                session.in_flight = max(0, session.in_flight - 1)
                session.last_used = self.clock()

    def match(self, session_id: str, prompt: Sequence[int]) -> Resume:
        """The conversation of `session_id` that `prompt` continues furthest."""
        key = SessionKey.of(session_id)
        with self._lock:
            session = self._sessions.get(key)
            conversations = list(session.conversations) if session else []
        best = _furthest(conversations, prompt)
        return Resume(best.conversation, best.shared, max(0, min(best.shared, len(prompt) - 1)))

    def park(self, session_id: str, conversation: Conversation, resumed: Resume) -> bool:
        """Keep a finished turn's history as the id's newest conversation. Returns True
        when that displaced another conversation of the id (a session conflict). An id
        released while its turn ran is not brought back."""
        key = SessionKey.of(session_id)
        with self._lock:
            session = self._sessions.get(key)
            if session is None:
                return False
            session.last_used = self.clock()
            conflict = self._add_locked(session, conversation, resumed)
        self._changed(key)
        return conflict

    # --- operator side -------------------------------------------------------------------

    def latest(self, session_id: str) -> Conversation:
        """The id's most recently used conversation (what an export takes)."""
        key = SessionKey.of(session_id)
        with self._lock:
            session = self._sessions.get(key)
            if session is not None and session.in_flight:
                raise SessionBusy(
                    f"a turn is in flight on session {key.id!r}; retry after it completes"
                )
            if session is None or not session.conversations:
                raise SessionNotFound(f"no live session {key.id!r}")
            return session.conversations[-1]

    def install(self, session_id: str, conversation: Conversation) -> None:
        """A restored conversation: it replaces the one its tokens continue, else it is
        added. A new id needs a free session slot (in the table and in its namespace)."""
        key = SessionKey.of(session_id)
        with self._lock:
            session = self._sessions.get(key)
            if session is not None and session.in_flight:
                raise SessionBusy(
                    f"a turn is in flight on session {key.id!r}; retry after it completes"
                )
            evicted = []
            if session is None:
                session, evicted = self._new_locked(key, False)
            session.implicit = False  # a restore is the client's own doing
            session.last_used = self.clock()
            self._add_locked(
                session, conversation, _furthest(session.conversations, conversation.tokens)
            )
        for victim in evicted:
            self._changed(victim)
        self._changed(key)

    def release(self, session_id: str) -> bool:
        """Forget every conversation of the id now; False if it held none."""
        key = SessionKey.of(session_id)
        with self._lock:
            self._grace.pop(key, None)
            released = self._sessions.pop(key, None) is not None
        if released:
            self._changed(key)
        return released

    def release_implicit(self, session_id: str) -> bool:
        """Release the id only if it is an implicit session (its owner is done with the
        chain that made it); an explicit one is the client's to release. False if not."""
        key = SessionKey.of(session_id)
        with self._lock:
            session = self._sessions.get(key)
            if session is None or not session.implicit:
                return False
        return self.release(key)

    def set_idle_ttl(self, session_id: str, seconds: float | None) -> bool:
        """Give one id its own idle TTL (an Ollama client's keep_alive): 0 drops it at the
        next reap once its turn is over, math.inf keeps it until released; None: back to
        the table's. False when the id holds nothing."""
        with self._lock:
            session = self._sessions.get(SessionKey.of(session_id))
            if session is None:
                return False
            session.idle_ttl_s = None if seconds is None else max(0.0, float(seconds))
            return True

    def would_admit(self, session_id: str, *, implicit: bool = False) -> bool:
        key = SessionKey.of(session_id)
        with self._lock:
            return key in self._sessions or self._room_locked(key, implicit)[0] is None

    def held(self, session_id: str) -> list[Conversation]:
        """The id's conversations, least recently used first ([] when it holds none)."""
        key = SessionKey.of(session_id)
        with self._lock:
            session = self._sessions.get(key)
            return list(session.conversations) if session is not None else []

    def durable(self, session_id: str) -> list[Conversation]:
        """What a write to disk keeps of the id: its conversations, none if it is implicit."""
        key = SessionKey.of(session_id)
        with self._lock:
            session = self._sessions.get(key)
            return list(session.conversations) if session and not session.implicit else []

    def owners(self, session_id: str) -> list[SessionKey]:
        """Every key that holds the bare id `session_id`, one per namespace (an operator's
        export looks a session up by its id alone)."""
        with self._lock:
            return [k for k in self._sessions if str.__eq__(k, session_id)]

    # --- watches -------------------------------------------------------------------------

    def watch(self, session_id: str) -> None:
        """A liveness hold: the id is not dropped while any watch of it is held."""
        key = SessionKey.of(session_id)
        with self._lock:
            if sum(self._watches.values()) >= self.max_watches:
                raise WatchUnavailable(f"the watch table is full ({self.max_watches} watches held)")
            if self._capped_locked(key, self._watches_cap_set):
                cap = self._watch_cap_locked()
                mine = sum(n for k, n in self._watches.items() if k.namespace == key.namespace)
                if mine >= cap:
                    raise WatchUnavailable(
                        f"this API key holds {mine} session watches, its limit "
                        f"({cap} of the model's {self.max_watches}); close one first"
                    )
            self._watches[key] = self._watches.get(key, 0) + 1
            self._grace.pop(key, None)

    def unwatch(self, session_id: str) -> None:
        """A watch closed: the id is dropped after the grace unless watched again."""
        key = SessionKey.of(session_id)
        with self._lock:
            held = self._watches.get(key, 0) - 1
            if held > 0:
                self._watches[key] = held
                return
            self._watches.pop(key, None)
            self._grace[key] = self.clock() + self.watch_grace_s

    def watches(self, session_id: str) -> int:
        with self._lock:
            return self._watches.get(SessionKey.of(session_id), 0)

    # --- housekeeping ----------------------------------------------------------------------

    def reap(self) -> list[SessionKey]:
        """Drop idle ids (past the TTL, or past the grace after their last watch closed),
        never one with a turn in flight or a watch held. Returns the dropped keys."""
        now = self.clock()
        dropped = []
        with self._lock:
            for key in [k for k, t in self._grace.items() if now >= t]:
                session = self._sessions.get(key)
                if session is not None and session.in_flight:
                    continue  # released once its turn is over
                del self._grace[key]
                if self._sessions.pop(key, None) is not None:
                    dropped.append(key)
            for key, session in list(self._sessions.items()):
                if session.in_flight or self._watches.get(key) or key in self._grace:
                    continue  # a watch's grace, not the idle TTL, decides for those
                if now - session.last_used >= self._ttl(session):
                    del self._sessions[key]
                    dropped.append(key)
        for key in dropped:
            self._changed(key)
        return dropped

    def info(self) -> list[SessionInfo]:
        with self._lock:
            return [self._info_locked(s) for s in self._sessions.values()]

    def conversations(
        self, *, durable: bool = False
    ) -> list[tuple[SessionKey, Conversation, float, float]]:
        """Every (session key, conversation, created, last used); `durable`: those a spill
        to disk keeps (implicit sessions left out)."""
        with self._lock:
            return [
                (s.session_id, c, s.created, s.last_used)
                for s in self._sessions.values()
                if not (durable and s.implicit)
                for c in s.conversations
            ]

    # --- internals -----------------------------------------------------------------------

    def _changed(self, key: SessionKey) -> None:
        listener = self.listener
        if listener is not None:
            listener(key)

    def _capped_locked(self, key: SessionKey, cap_set: bool) -> bool:
        """Whether `key`'s namespace is held to its per-key cap: never the open one; always
        when the cap was set explicitly; else only when several keys could hold sessions."""
        if key.namespace == OPEN:
            return False
        if cap_set or self.several_keys is None:
            return True
        try:
            return bool(self.several_keys())
        except Exception:  # an answer that cannot be had: the safe side
            return True

    def _watch_cap_locked(self) -> int:
        """A capped key's watch limit: `key_max_watches`, but never more than the table's
        share per key (the table divided among the keys that could hold watches, two
        while that count is unknown), so keys under their cap can never fill the table
        together and a key under its cap is not refused because others filled it."""
        holders = None
        if self.key_holders is not None:
            try:
                holders = self.key_holders()
            except Exception:  # an answer that cannot be had: the default's two keys
                holders = None
        share = self.max_watches // (max(1, holders) if holders else 2)
        return max(1, min(self.key_max_watches, share))

    def _ttl(self, session: _Session) -> float:
        if session.idle_ttl_s is not None:
            return session.idle_ttl_s
        return self.implicit_ttl_s if session.implicit else self.idle_ttl_s

    def _refusal_locked(self, key: SessionKey, gone: Sequence[SessionKey] = ()) -> str | None:
        """Why a new id `key` cannot have a slot now, or None when it can (once the
        sessions `gone` are evicted)."""
        if len(self._sessions) - len(gone) >= self.max_sessions:
            return f"all {self.max_sessions} session slots hold live sessions"
        if self._capped_locked(key, self._sessions_cap_set):
            mine = sum(1 for k in self._sessions if k.namespace == key.namespace and k not in gone)
            if mine >= self.key_max_sessions:
                return (
                    f"this API key holds {mine} live sessions, its limit "
                    f"({self.key_max_sessions} of the model's {self.max_sessions} slots)"
                )
        return None

    def _room_locked(self, key: SessionKey, implicit: bool) -> tuple[str | None, list]:
        """(why a new id `key` cannot have a slot, or None; the implicit sessions to evict
        first so that it can). An implicit id takes only a free slot; an explicit one
        evicts implicit ones, least recently used and idle first: in any namespace while
        the table is full, in its own while its namespace is at its cap."""
        gone: list[SessionKey] = []
        while (refusal := self._refusal_locked(key, gone)) is not None and not implicit:
            full = len(self._sessions) - len(gone) >= self.max_sessions
            candidates = [
                s
                for k, s in self._sessions.items()
                if s.implicit and k not in gone and (full or k.namespace == key.namespace)
            ]
            if not candidates:
                break
            victim = min(
                candidates,
                key=lambda s: (bool(s.in_flight or self._watches.get(s.session_id)), s.last_used),
            )
            gone.append(victim.session_id)
        return refusal, [] if refusal is not None else gone

    def _new_locked(self, key: SessionKey, implicit: bool) -> tuple[_Session, list[SessionKey]]:
        """A new session for `key` (SessionCapacity when there is no room) and the
        implicit sessions evicted to make room for it."""
        refusal, evict = self._room_locked(key, implicit)
        if refusal is not None:
            raise SessionCapacity(refusal)
        for victim in evict:
            self._grace.pop(victim, None)
            del self._sessions[victim]
        now = self.clock()
        session = _Session(key, created=now, last_used=now, implicit=implicit)
        self._sessions[key] = session
        return session, evict

    def _add_locked(self, session: _Session, conversation: Conversation, resumed: Resume) -> bool:
        convs = session.conversations
        if resumed.conversation is not None and 2 * resumed.shared >= resumed.conversation.n_tok:
            convs[:] = [c for c in convs if c is not resumed.conversation]
        # A conversation the new history merely extends holds nothing the new one lacks.
        convs[:] = [c for c in convs if shared_prefix(c.tokens, conversation.tokens) < c.n_tok]
        conflict = False
        while len(convs) >= MAX_CONVERSATIONS:
            convs.pop(0)
            conflict = True
        convs.append(conversation)
        return conflict

    def _info_locked(self, s: _Session) -> SessionInfo:
        return SessionInfo(
            session_id=s.session_id,
            conversations=len(s.conversations),
            tokens=s.conversations[-1].n_tok if s.conversations else 0,
            total_tokens=sum(c.n_tok for c in s.conversations),
            kv_bytes=sum(c.nbytes for c in s.conversations),
            created=s.created,
            last_used=s.last_used,
            in_flight=s.in_flight,
            watches=self._watches.get(s.session_id, 0),
            namespace=s.session_id.namespace,
            implicit=s.implicit,
        )
