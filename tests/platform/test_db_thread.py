"""ORM work off the event loop (pantheon_platform/db_thread.py): a locked SQLite database is
retried, a lasting lock is a 503 server_busy (DatabaseBusy), other errors pass through; the
batch runner treats a lasting lock as "record this line later", not as a failed line."""

from __future__ import annotations

import asyncio

import pytest
from django.db import OperationalError

from pantheon_platform import db_thread
from pantheon_platform.db_thread import DatabaseBusy, on_db_thread
from wire.batches import runner


@pytest.fixture(autouse=True)
def _fast_retries(monkeypatch):
    monkeypatch.setattr(db_thread, "LOCKED_RETRY_S", (0.0, 0.0, 0.0))


def _locked_then(result, failures: int):
    calls = []

    def work(x):
        calls.append(x)
        if len(calls) <= failures:
            raise OperationalError("database table is locked")
        return result

    return work, calls


def test_a_brief_lock_is_retried_until_the_work_succeeds():
    work, calls = _locked_then("done", failures=2)
    assert asyncio.run(on_db_thread(work, 7)) == "done"
    assert calls == [7, 7, 7]


def test_a_lasting_lock_is_a_503_server_busy():
    work, calls = _locked_then("never", failures=99)
    with pytest.raises(DatabaseBusy) as raised:
        asyncio.run(on_db_thread(work, 1))
    assert raised.value.status == 503 and raised.value.type == "server_busy"
    assert len(calls) == 3


def test_other_database_errors_are_not_retried():
    calls = []

    def work():
        calls.append(1)
        raise OperationalError("no such table: x")

    with pytest.raises(OperationalError):
        asyncio.run(on_db_thread(work))
    assert calls == [1]


def test_the_batch_runner_tries_again_after_a_lasting_lock(monkeypatch):
    # Each on_db_thread call gives up after three locked tries; the runner's own retry
    # runs it again, so a lock held across the first call does not lose the line.
    monkeypatch.setattr(runner.asyncio, "sleep", _no_sleep)
    work, calls = _locked_then("recorded", failures=4)
    assert asyncio.run(runner._retrying(work, "line")) == "recorded"
    assert len(calls) == 5


async def _no_sleep(_seconds):
    return None
