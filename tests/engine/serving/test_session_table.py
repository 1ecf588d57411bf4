"""The session table as bookkeeping: matching, replacing, displacing, residency, watches."""

from __future__ import annotations

import numpy as np
import pytest

from engine.serving.sessions import (
    MAX_CONVERSATIONS,
    Conversation,
    Resume,
    SessionTable,
    shared_prefix,
)
from engine.types import SessionBusy, SessionCapacity, SessionNotFound, WatchUnavailable


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def conv(*tokens: int) -> Conversation:
    shape = (2, 1, len(tokens), 4)
    return Conversation(tuple(tokens), np.zeros(shape, np.float32), np.zeros(shape, np.float32))


def turn(table: SessionTable, sid: str, prompt: tuple[int, ...], output: tuple[int, ...]):
    """One finished turn: begin, match, park prompt + output; returns (resume, conflict)."""
    table.begin_turn(sid)
    resume = table.match(sid, prompt)
    conflict = table.park(sid, conv(*prompt, *output), resume)
    table.end_turn(sid)
    return resume, conflict


def test_shared_prefix():
    assert shared_prefix((1, 2, 3), (1, 2, 4)) == 2
    assert shared_prefix((1, 2), (1, 2, 3)) == 2
    assert shared_prefix((), (1,)) == 0
    assert shared_prefix((5,), (1,)) == 0


def test_a_second_turn_resumes_from_the_first_and_replaces_it():
    table = SessionTable(2)
    resume, _ = turn(table, "a", (1, 2, 3), (4, 5))
    assert resume.cached == 0
    resume, conflict = turn(table, "a", (1, 2, 3, 4, 5, 6, 7), (8,))
    assert (resume.shared, resume.cached, conflict) == (5, 5, False)
    [info] = table.info()
    assert (info.conversations, info.tokens) == (1, 8)


def test_at_least_one_prompt_token_is_computed():
    table = SessionTable(1)
    turn(table, "a", (1, 2, 3), (4,))
    resume = table.match("a", (1, 2, 3, 4))
    assert (resume.shared, resume.cached) == (4, 3)


def test_a_different_conversation_under_one_id_keeps_its_own_cache():
    table = SessionTable(1)
    turn(table, "a", (1, 2, 3, 4), (5,))  # the real conversation
    turn(table, "a", (9, 8), (7,))  # a title request
    resume, _ = turn(table, "a", (1, 2, 3, 4, 5, 6), (7,))
    assert resume.cached == 5
    resume, _ = turn(table, "a", (9, 8, 7, 1), (2,))
    assert resume.cached == 3
    assert table.info()[0].conversations == 2


def test_displacing_another_conversation_is_a_conflict():
    table = SessionTable(1)
    for i in range(MAX_CONVERSATIONS):
        _, conflict = turn(table, "a", (100 + i, 1), (2,))
        assert not conflict
    _, conflict = turn(table, "a", (200, 1), (2,))
    assert conflict
    assert table.info()[0].conversations == MAX_CONVERSATIONS
    assert table.match("a", (100, 1, 2, 3)).cached == 0  # the least recently used went


def test_an_edited_last_turn_replaces_the_conversation():
    table = SessionTable(1)
    turn(table, "a", (1, 2, 3, 4, 5, 6), (7,))
    resume, conflict = turn(table, "a", (1, 2, 3, 4, 9), (10,))
    assert resume.shared == 4 and not conflict
    assert table.info()[0].conversations == 1


def test_a_new_id_past_max_sessions_is_refused():
    table = SessionTable(2)
    turn(table, "a", (1,), (2,))
    turn(table, "b", (1,), (2,))
    with pytest.raises(SessionCapacity):
        table.begin_turn("c")
    table.begin_turn("a")  # a held id is always served
    table.end_turn("a")
    assert table.release("b") is True
    assert table.release("b") is False  # idempotent
    table.begin_turn("c")


def test_a_released_id_is_not_brought_back_by_its_running_turn():
    table = SessionTable(1)
    table.begin_turn("a")
    resume = table.match("a", (1, 2))
    table.release("a")
    assert table.park("a", conv(1, 2, 3), resume) is False
    assert len(table) == 0


def test_export_takes_the_latest_and_refuses_while_busy():
    table = SessionTable(1)
    with pytest.raises(SessionNotFound):
        table.latest("a")
    turn(table, "a", (1, 2), (3,))
    turn(table, "a", (7, 8), (9,))
    assert table.latest("a").tokens == (7, 8, 9)
    table.begin_turn("a")
    with pytest.raises(SessionBusy):
        table.latest("a")


def test_install_replaces_the_conversation_it_continues():
    table = SessionTable(1)
    turn(table, "a", (1, 2), (3,))
    table.install("a", conv(1, 2, 3, 4, 5))
    assert [i.tokens for i in table.info()] == [5]
    assert table.info()[0].conversations == 1
    with pytest.raises(SessionCapacity):
        table.install("b", conv(1))


def test_idle_sessions_are_reaped_after_the_ttl():
    clock = Clock()
    table = SessionTable(2, idle_ttl_s=10, clock=clock)
    turn(table, "a", (1,), (2,))
    clock.now += 9
    assert table.reap() == []
    clock.now += 1
    assert table.reap() == ["a"]


def test_a_turn_in_flight_is_never_reaped():
    clock = Clock()
    table = SessionTable(1, idle_ttl_s=1, clock=clock)
    table.begin_turn("a")
    clock.now += 100
    assert table.reap() == []


def test_a_watched_session_survives_the_ttl_and_goes_after_the_grace():
    clock = Clock()
    table = SessionTable(1, idle_ttl_s=1, watch_grace_s=5, clock=clock)
    table.watch("a")
    turn(table, "a", (1,), (2,))
    clock.now += 100
    assert table.reap() == []
    table.unwatch("a")
    clock.now += 4
    assert table.reap() == []
    clock.now += 1
    assert table.reap() == ["a"]


def test_a_new_watch_within_the_grace_keeps_the_session():
    clock = Clock()
    table = SessionTable(1, idle_ttl_s=1000, watch_grace_s=5, clock=clock)
    turn(table, "a", (1,), (2,))
    table.watch("a")
    table.unwatch("a")
    clock.now += 3
    table.watch("a")
    clock.now += 10
    assert table.reap() == []
    assert table.watches("a") == 1


def test_the_watch_table_has_a_size():
    table = SessionTable(1, max_watches=2)
    table.watch("a")
    table.watch("b")
    with pytest.raises(WatchUnavailable):
        table.watch("c")
    table.unwatch("a")
    table.watch("c")


def test_resume_defaults_are_cold():
    assert Resume().cached == 0 and Resume().conversation is None
