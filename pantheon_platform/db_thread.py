"""ORM work off the event loop: `await on_db_thread(work, *args)` runs `work(*args)` on a
worker thread and closes its connection after, so the ORM never runs on the event loop
and no connection is left behind in a pool thread.

SQLite answers "database (table) is locked" at once where another thread holds a write
(the test database's shared cache; a busy file past its timeout): the work is tried again
after short waits, never a 500, and when the lock outlasts them the answer is a 503
server_busy with Retry-After. `work` must therefore be safe to run again after it failed:
one transaction, or steps that are each harmless to repeat.
"""

from __future__ import annotations

import time

from asgiref.sync import sync_to_async
from django.db import OperationalError, connection

from pantheon_platform.errors import ApiError

LOCKED_RETRY_S = (0.05, 0.1, 0.2, 0.4, 0.8, 1.6)  # waits between tries on a locked database


class DatabaseBusy(ApiError):
    """The database stayed locked through every retry: a 503 server_busy to a client;
    background writers (the batch runner) catch it and try the work again later."""

    def __init__(self):
        super().__init__(
            503,
            "the database is busy (locked by another writer); retry",
            "server_busy",
            headers={"Retry-After": "1"},
        )


def is_locked(exc: OperationalError) -> bool:
    return "locked" in str(exc)


async def on_db_thread(work, *args):
    def run():
        for delay in LOCKED_RETRY_S:
            try:
                return work(*args)
            except OperationalError as exc:
                if not is_locked(exc):
                    raise
                connection.close()
                time.sleep(delay)
            finally:
                connection.close()
        raise DatabaseBusy()

    return await sync_to_async(run, thread_sensitive=False)()
