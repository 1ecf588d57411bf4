"""Implicit sessions (an id the server chose: the Responses API's chain) never crowd out
explicit ones: an explicit id that finds no free slot evicts implicit sessions first, least
recently used and idle before busy; an implicit id takes only a free slot; an idle one
is dropped after its own short TTL; none is ever written to disk. Bookkeeping first (a
fake clock), then the probe on the real engine."""

from __future__ import annotations

import numpy as np
import pytest

from engine.serving.session_key import SessionKey
from engine.serving.sessions import Conversation, SessionTable
from engine.types import GenerationRequest, SamplingParams, SessionCapacity
from tests.support import generate_text


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def conv(*tokens: int) -> Conversation:
    shape = (2, 1, len(tokens), 4)
    return Conversation(tuple(tokens), np.zeros(shape, np.float32), np.zeros(shape, np.float32))


def turn(table: SessionTable, key: str, *, implicit: bool = False, end: bool = True) -> None:
    """One turn of `key` that parks a conversation (left in flight unless `end`)."""
    table.begin_turn(key, implicit=implicit)
    table.park(key, conv(1, 2, 3), table.match(key, (1, 2)))
    if end:
        table.end_turn(key)


def implicit_in(namespace: str) -> SessionKey:
    return SessionKey("pantheon-responses", namespace)


def held(table: SessionTable) -> set[tuple[str, str, bool]]:
    return {(i.namespace, i.session_id.id, i.implicit) for i in table.info()}


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_an_explicit_id_evicts_the_least_recently_used_implicit_session(clock):
    table = SessionTable(4, clock=clock)
    for n in range(4):  # four keys, one Responses call each: every slot
        turn(table, implicit_in(f"key:{n}"), implicit=True)
        clock.now += 1
    changed = []
    table.listener = changed.append
    admin = SessionKey("work", "env:admin")
    turn(table, admin)  # admitted at once: no SessionCapacity
    assert changed[0] == implicit_in("key:0")  # the oldest, told to the listener
    assert held(table) == {
        ("key:1", "pantheon-responses", True),
        ("key:2", "pantheon-responses", True),
        ("key:3", "pantheon-responses", True),
        ("env:admin", "work", False),
    }


def test_an_idle_implicit_session_goes_before_one_with_a_turn_in_flight(clock):
    table = SessionTable(2, clock=clock)
    turn(table, implicit_in("key:a"), implicit=True, end=False)  # older, still running
    clock.now += 5
    turn(table, implicit_in("key:b"), implicit=True)  # newer, idle
    table.begin_turn(SessionKey("mine", "key:c"))
    assert implicit_in("key:a") in table and implicit_in("key:b") not in table
    # A busy one is evicted too when nothing else is left: its turn just parks nothing.
    table.begin_turn(SessionKey("mine-2", "key:d"))
    assert implicit_in("key:a") not in table
    assert table.park(implicit_in("key:a"), conv(1, 2), table.match("x", ())) is False
    assert implicit_in("key:a") not in table


def test_an_implicit_id_takes_only_a_free_slot(clock):
    table = SessionTable(2, clock=clock)
    turn(table, implicit_in("key:a"), implicit=True)
    turn(table, SessionKey("mine", "key:b"))
    with pytest.raises(SessionCapacity):  # the view then runs it without a session
        table.begin_turn(implicit_in("key:c"), implicit=True)
    assert not table.would_admit(implicit_in("key:c"), implicit=True)
    assert table.would_admit(SessionKey("other", "key:c"))  # an explicit one would evict


def test_explicit_sessions_are_never_evicted(clock):
    table = SessionTable(2, clock=clock)
    turn(table, SessionKey("one", "key:a"))
    turn(table, SessionKey("two", "key:b"))
    with pytest.raises(SessionCapacity, match="all 2 session slots"):
        table.begin_turn(SessionKey("three", "key:c"))
    assert len(table) == 2


def test_an_implicit_session_counts_against_its_own_keys_cap(clock):
    table = SessionTable(8, key_max_sessions=2, clock=clock)
    turn(table, implicit_in("key:a"), implicit=True)
    turn(table, implicit_in("key:b"), implicit=True)
    turn(table, SessionKey("first", "key:a"))
    # key:a holds its cap (its implicit session and one explicit): a second explicit id
    # evicts key:a's own implicit session, never key:b's (the table has room).
    turn(table, SessionKey("second", "key:a"))
    assert implicit_in("key:a") not in table and implicit_in("key:b") in table
    # At its cap with explicit ids only, key:a's implicit id gets no slot.
    with pytest.raises(SessionCapacity, match="this API key holds 2"):
        table.begin_turn(implicit_in("key:a"), implicit=True)


def test_an_idle_implicit_session_is_dropped_after_its_own_short_ttl(clock):
    table = SessionTable(4, idle_ttl_s=12 * 3600, implicit_ttl_s=300, clock=clock)
    turn(table, implicit_in("key:a"), implicit=True)
    turn(table, SessionKey("mine", "key:a"))
    clock.now += 299
    assert table.reap() == []
    clock.now += 1
    assert table.reap() == [implicit_in("key:a")]
    assert SessionKey("mine", "key:a") in table  # the table's TTL: twelve hours


def test_an_explicit_turn_or_a_restore_makes_an_implicit_id_explicit(clock):
    table = SessionTable(2, implicit_ttl_s=300, clock=clock)
    key = implicit_in("key:a")
    turn(table, key, implicit=True)
    turn(table, key)  # the client named the id itself
    turn(table, key, implicit=True)  # a server-chosen turn does not make it implicit again
    assert held(table) == {("key:a", "pantheon-responses", False)}
    clock.now += 301
    assert table.reap() == [] and table.durable(key)
    other = implicit_in("key:b")
    turn(table, other, implicit=True)
    table.install(other, conv(7, 8))  # a restore (POST /session/restore): the client's
    assert ("key:b", "pantheon-responses", False) in held(table)


def test_implicit_sessions_are_never_durable(clock):
    table = SessionTable(4, clock=clock)
    turn(table, implicit_in("key:a"), implicit=True)
    turn(table, SessionKey("mine", "key:a"))
    assert table.durable(implicit_in("key:a")) == []
    assert table.held(implicit_in("key:a"))  # held in memory all the same
    assert [k for k, *_ in table.conversations(durable=True)] == [SessionKey("mine", "key:a")]
    assert len(table.conversations()) == 2  # what the metrics count: both


def test_release_implicit_releases_only_an_implicit_session(clock):
    table = SessionTable(4, clock=clock)
    turn(table, implicit_in("key:a"), implicit=True)
    turn(table, SessionKey("mine", "key:a"))
    assert table.release_implicit(SessionKey("mine", "key:a")) is False
    assert table.release_implicit(implicit_in("key:b")) is False  # another key's id: none
    assert table.release_implicit(implicit_in("key:a")) is True
    assert held(table) == {("key:a", "mine", False)}


# --- the real engine --------------------------------------------------------------------

GREEDY = SamplingParams(temperature=0.0, max_tokens=2)


@pytest.fixture
def svc(smollm2_service):
    yield smollm2_service
    for info in smollm2_service.session_info():  # the shared service's session slots
        smollm2_service.release_session(info.session_id)


def run(svc, key: SessionKey, text: str, *, implicit: bool = False):
    ids = svc.encode_chat([{"role": "user", "content": text}])
    request = GenerationRequest(
        f"implicit-{key.namespace}-{key.id}",
        tuple(ids),
        GREEDY,
        session_id=key,
        session_implicit=implicit,
    )
    return generate_text(svc, request)


def test_four_keys_implicit_sessions_leave_an_explicit_session_its_slot(svc):
    assert svc.max_sessions == 4 and svc.sessions.implicit_ttl_s == 300.0
    for n in range(4):
        run(svc, implicit_in(f"key:{n}"), f"Say {n}.", implicit=True)
    assert {(i.namespace, i.implicit) for i in svc.session_info()} == {
        (f"key:{n}", True) for n in range(4)
    }
    text, finish = run(svc, SessionKey("admin-work", "env:admin"), "Say hi.")
    assert finish.finish_reason in ("stop", "length")
    assert len(svc.session_info()) == 4
    assert implicit_in("key:0") not in svc.sessions  # the least recently used went
    [admin] = [i for i in svc.session_info() if i.namespace == "env:admin"]
    assert not admin.implicit and admin.conversations == 1
    # The next turn of the explicit session resumes from its KV.
    again = svc.encode_chat(
        [
            {"role": "user", "content": "Say hi."},
            {"role": "assistant", "content": text},
            {"role": "user", "content": "Again."},
        ]
    )
    request = GenerationRequest(
        "implicit-again", tuple(again), GREEDY, session_id=SessionKey("admin-work", "env:admin")
    )
    assert generate_text(svc, request)[1].usage.cached_tokens > 0
