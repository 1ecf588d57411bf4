"""How many keys could hold sessions, for the per-key session caps. (Whose sessions a
request reaches, the caller's namespace and `session_key`, is the platform's:
pantheon_platform/tenancy.py.)

Per-key caps (PANTHEON_KEY_MAX_SESSIONS, PANTHEON_KEY_MAX_WATCHES) left at 0 keep one key
to half a model's session slots and watches only while more than one key could hold
sessions: the env keys that are set (PANTHEON_API_KEY, PANTHEON_ADMIN_API_KEY) plus the
unrevoked console keys with the `inference` or `sessions` scope. With one such key (or
none: an open server) that key may use every slot. `attach` gives a model's session
table `several_keys`, which the table calls under its lock: it reads a count kept here,
counted again when a console key is saved or deleted in this process (sessions.apps) and
at most CACHE_TTL_S old otherwise (recounted in a background thread, never on the
caller's); until a first count it answers "several" (the caps apply). The default watch
cap is the watch table divided among those keys (`key_holders`), so keys under their cap
can never fill the table together; see SessionTable.watch.
"""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger("pantheon.sessions")

CACHE_TTL_S = 5.0  # another process may add or revoke a console key

# --- how many keys could hold sessions ----------------------------------------------------

_lock = threading.Lock()
# count: None until counted; generation: bumped by forget(), so a count begun before it
# is not kept.
_console: dict = {"count": None, "until": 0.0, "refreshing": False, "generation": 0}


def _env_holders() -> int:
    from access import keys

    return len(keys.env_principals())  # both env keys may hold sessions


def count_console_holders() -> int:
    """Unrevoked console keys that could hold sessions (the watch cap divides the table
    among them). Database access: call from a thread."""
    from access.models import ApiKey
    from pantheon_platform.routes import INFERENCE, SESSIONS

    found = 0
    for scopes in ApiKey.objects.filter(revoked=False).values_list("scopes", flat=True):
        if isinstance(scopes, list) and (INFERENCE in scopes or SESSIONS in scopes):
            found += 1
    return found


def refresh(*args, **kwargs) -> None:
    """Count the console keys again now (database access: call from a thread; also the
    ApiKey save/delete signal receiver). On failure the count is unknown: caps apply."""
    with _lock:
        generation = _console["generation"]
    try:
        count = count_console_holders()
    except Exception:
        log.warning("per-key session caps: cannot count the console keys", exc_info=True)
        count = None
    with _lock:
        if _console["generation"] == generation:
            _console.update(count=count, until=time.monotonic() + CACHE_TTL_S)


def _refresh_in_background() -> None:
    from django.db import connection

    try:
        refresh()
    finally:
        with _lock:
            _console["refreshing"] = False
        connection.close()  # this thread's own connection


def several_keys() -> bool:
    """Whether more than one key could hold sessions on this server. Never blocks: a
    stale count is answered and counted again in the background."""
    if _env_holders() > 1:
        return True
    holders = key_holders()
    return True if holders is None else holders > 1


def key_holders() -> int | None:
    """How many keys could hold sessions (env keys set plus console keys), None until
    first counted. Never blocks: a stale count is answered and counted again in the
    background."""
    env = _env_holders()
    with _lock:
        count = _console["count"]
        start = time.monotonic() >= _console["until"] and not _console["refreshing"]
        if start:
            _console["refreshing"] = True
    if start:
        threading.Thread(
            target=_refresh_in_background, name="pantheon-key-count", daemon=True
        ).start()
    return None if count is None else env + count


def attach(table) -> None:
    """Give a model's session table the server's answer to "several keys?" (the session
    load hook, sessions.persistence.restore_on_load). Counts first when nothing has been
    counted yet (the load hook runs in a thread that may use the database)."""
    with _lock:
        unknown = _console["count"] is None
    if unknown:
        refresh()
    table.several_keys = several_keys
    table.key_holders = key_holders


def forget() -> None:
    """Drop the count (tests)."""
    with _lock:
        _console.update(count=None, until=0.0, generation=_console["generation"] + 1)
