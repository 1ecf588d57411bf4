"""Who a presented key is: the env keys (PANTHEON_API_KEY, PANTHEON_ADMIN_API_KEY) and the
console keys (access.models.ApiKey, found by the sha256 of the key).

Env keys are compared in constant time (hmac.compare_digest). A console key is looked up
by its digest, so the comparison never touches the key itself.
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import threading
import time
from dataclasses import dataclass, field
from datetime import timedelta

from django.conf import settings

from pantheon_platform import live_settings
from pantheon_platform.routes import INFERENCE, SCOPES, SESSIONS

KEY_PREFIX = "pn_"
PREFIX_CHARS = 10  # "pn_" and 7 random characters: shown in the console to tell keys apart
LAST_USED_EVERY = timedelta(seconds=60)  # last_used_at is written at most this often
CACHE_TTL_S = 5.0  # "does any console key exist?" (another process may add one)

log = logging.getLogger("pantheon.http")

CLIENT_SCOPES = frozenset({INFERENCE, SESSIONS})
ALL_SCOPES = frozenset(SCOPES)


@dataclass(frozen=True)
class Principal:
    """An authenticated key. `label` names it in logs (never the key); `identity` counts
    its in-flight requests; `max_concurrent` None means PANTHEON_KEY_MAX_CONCURRENT."""

    label: str
    identity: str
    scopes: frozenset = field(default_factory=frozenset)
    max_concurrent: int | None = None
    priority: str = "interactive"  # the class of every request the key sends


def generate() -> str:
    return KEY_PREFIX + secrets.token_urlsafe(32)


def digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()


def env_principals() -> list[tuple[str, Principal]]:
    """(key, principal) for each env key that is set. PANTHEON_API_KEY alone also opens
    the operator routes (admin, session_export): the fallback."""
    client = settings.PANTHEON_API_KEY
    admin = settings.PANTHEON_ADMIN_API_KEY
    found = []
    if admin:
        found.append((admin, Principal("env:admin", "env:admin", ALL_SCOPES)))
    if client:
        scopes = CLIENT_SCOPES if admin else ALL_SCOPES
        found.append((client, Principal("env:client", "env:client", scopes)))
    return found


def match_env(presented: list[str]) -> Principal | None:
    """The env key among `presented`, compared in constant time against every env key."""
    matched = None
    for key, principal in env_principals():
        expected = key.encode("utf-8", "surrogateescape")
        for candidate in presented:
            if hmac.compare_digest(candidate.encode("utf-8", "surrogateescape"), expected):
                matched = matched or principal
    return matched


# The key table is read and written from several request threads at once (each request
# of a fresh key notes last_used_at). SQLite in shared-cache mode (the tests' in-memory
# database) answers a read that meets another connection's uncommitted write with "table
# is locked" at once, and the guard then fails closed (503) on a key it should admit; one
# process lock over this module's queries keeps them from meeting. Lookups are cached
# and cheap, so the lock costs nothing noticeable.
_db_lock = threading.Lock()


def lookup_console(presented: list[str]) -> Principal | None:
    """The active console key among `presented` (database access: call from a thread)."""
    with _db_lock:
        return _lookup_console(presented)


def _lookup_console(presented: list[str]) -> Principal | None:
    from django.utils import timezone

    from access.models import ApiKey

    for candidate in presented:
        if not candidate.startswith(KEY_PREFIX):
            continue
        row = ApiKey.objects.filter(key_hash=digest(candidate), revoked=False).first()
        if row is None:
            continue
        now = timezone.now()
        if row.last_used_at is None or now - row.last_used_at >= LAST_USED_EVERY:
            _note_last_used(row.pk, now)
        return Principal(
            f"console:{row.prefix}",
            f"console:{row.pk}",
            frozenset(row.scopes) & ALL_SCOPES,
            row.max_concurrent or None,
            row.priority or "interactive",
        )
    return None


def _note_last_used(pk, now) -> None:
    """Best effort: bookkeeping never refuses a request its key admits (another process
    may hold the table; the next request past LAST_USED_EVERY writes it again). The
    caller holds _db_lock."""
    from django.db import DatabaseError, transaction

    from access.models import ApiKey

    try:
        with transaction.atomic():  # a savepoint when a caller holds a transaction
            ApiKey.objects.filter(pk=pk).update(last_used_at=now)
    except DatabaseError as exc:
        log.info("API keys: last_used_at for key %s not written (%s)", pk, exc)


_cache_lock = threading.Lock()
_cache: dict = {"value": None, "until": 0.0}


def cached_console_keys_exist() -> bool | None:
    """console_keys_exist() while its cached answer is fresh, else None (no database)."""
    with _cache_lock:
        if _cache["value"] is not None and time.monotonic() < _cache["until"]:
            return _cache["value"]
    return None


def console_keys_exist() -> bool:
    """Whether an unrevoked console key exists (database access: call from a thread).
    Cached for CACHE_TTL_S; saving or deleting an ApiKey in this process clears it."""
    cached = cached_console_keys_exist()
    if cached is not None:
        return cached
    from access.models import ApiKey

    with _db_lock:
        value = ApiKey.objects.filter(revoked=False).exists()
    with _cache_lock:
        _cache.update(value=value, until=time.monotonic() + CACHE_TTL_S)
    return value


def forget_cache(*args, **kwargs) -> None:
    """Signal receiver (access.apps): the next check reads the database."""
    with _cache_lock:
        _cache.update(value=None, until=0.0)


def any_key_configured() -> bool:
    """An env key is set or an active console key exists (database access when no env key
    is set). With none, every route is open (the contract's default)."""
    return bool(env_principals()) or console_keys_exist()


def max_concurrent_for(principal: Principal) -> int:
    """In-flight requests the key may have at once; 0: no limit. The key's own limit,
    else key_max_concurrent (the runtime config, else PANTHEON_KEY_MAX_CONCURRENT)."""
    return principal.max_concurrent or live_settings.value("key_max_concurrent")
