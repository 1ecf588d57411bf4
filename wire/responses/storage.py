"""Stored responses, bounded: the ORM side of POST/GET/DELETE /v1/responses.

A record (its conversation and response object, as JSON) larger than
PANTHEON_RESPONSES_MAX_ITEM_BYTES (or than the key's whole byte cap) is not stored: the
response is answered with `store: false`. Each key (namespace) keeps at most
PANTHEON_RESPONSES_MAX_PER_KEY records and PANTHEON_RESPONSES_MAX_BYTES_PER_KEY bytes:
storing one more evicts that key's oldest until both hold (never the one just written;
another key's are not looked at). A record older than PANTHEON_RESPONSES_TTL_S is gone:
deleted when it is asked for, and every expired one at most PRUNE_EVERY_S after the last
sweep, when a response is stored (and when /admin/stats reports). Evicted or expired, an
id is answered as one that never existed.

Every function here is blocking ORM work: the views run them through `db` (a worker
thread, never the event loop).
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.db import OperationalError, transaction
from django.db.models import Count, Sum
from django.utils import timezone

from pantheon_platform.db_thread import is_locked, on_db_thread
from wire.responses.models import StoredResponse

PRUNE_EVERY_S = 60.0  # the sweep of expired records, at most this often per process
_DELETE_CHUNK = 500  # ids per DELETE (SQLite's bound on a statement's variables)
_prune_lock = threading.Lock()
_last_prune: float | None = None  # time.monotonic() of the last sweep


# ORM work on a worker thread, retried while SQLite reports a lock (a batch runner or the
# session mirror writing beside the route): pantheon_platform/db_thread.py. What runs
# through it is one transaction, or steps harmless to repeat (save's prune).
db = on_db_thread


def record_size(conversation: list[dict], body: dict) -> int:
    """The bytes a record takes as the JSON fields store it (ASCII: one byte a character)."""
    return len(json.dumps(conversation)) + len(json.dumps(body))


def item_limit() -> int:
    """The largest record stored: the item cap, or the key's whole byte cap if smaller."""
    return min(
        settings.PANTHEON_RESPONSES_MAX_ITEM_BYTES, settings.PANTHEON_RESPONSES_MAX_BYTES_PER_KEY
    )


def save(
    body: dict, namespace: str, model: str, session_id: str | None, conversation: list[dict]
) -> bool:
    """Store the response (then evict the key's oldest past its caps); False, storing
    nothing, when its record is over item_limit()."""
    size = record_size(conversation, body)
    if size > item_limit():
        return False
    with transaction.atomic():
        StoredResponse.objects.create(
            id=body["id"],
            namespace=namespace,
            model_name=model,
            session_id=session_id,
            conversation=conversation,
            body=body,
            size=size,
        )
        _evict(namespace, body["id"], size)
    try:
        prune_expired()
    except OperationalError as exc:  # housekeeping: the next save prunes; never a retry of
        if not is_locked(exc):  # the stored record (db() would create it twice)
            raise
    return True


def _evict(namespace: str, kept: str, size: int) -> None:
    """Delete the key's oldest records until its count and bytes (`kept`, of `size`
    bytes, included) are within the caps: the newest that fit are kept."""
    max_count = settings.PANTHEON_RESPONSES_MAX_PER_KEY
    max_bytes = settings.PANTHEON_RESPONSES_MAX_BYTES_PER_KEY
    count, total, evicted = 1, size, []
    newest_first = (
        StoredResponse.objects.filter(namespace=namespace)
        .exclude(id=kept)
        .order_by("-created", "-id")
        .values_list("id", "size")
    )
    for response_id, row_size in newest_first.iterator():
        if evicted or count + 1 > max_count or total + row_size > max_bytes:
            evicted.append(response_id)
        else:
            count, total = count + 1, total + row_size
    for start in range(0, len(evicted), _DELETE_CHUNK):
        StoredResponse.objects.filter(id__in=evicted[start : start + _DELETE_CHUNK]).delete()


def _cutoff():
    """Records created before this have expired."""
    return timezone.now() - timedelta(seconds=settings.PANTHEON_RESPONSES_TTL_S)


def prune_expired(*, force: bool = False) -> int:
    """Delete every expired record (all keys) unless a sweep ran in the last
    PRUNE_EVERY_S (`force`: regardless); how many were deleted."""
    global _last_prune
    now = time.monotonic()
    with _prune_lock:
        if not force and _last_prune is not None and now - _last_prune < PRUNE_EVERY_S:
            return 0
        _last_prune = now
    deleted, _ = StoredResponse.objects.filter(created__lt=_cutoff()).delete()
    return deleted


def find(namespace: str, response_id: str) -> StoredResponse | None:
    """The key's record, or None (none, or expired: then deleted now)."""
    stored = StoredResponse.objects.filter(id=response_id, namespace=namespace).first()
    if stored is not None and stored.created < _cutoff():
        stored.delete()
        return None
    return stored


@dataclass(frozen=True)
class Deleted:
    model: str
    session_id: str | None  # the session its turn ran under (None: none)
    last: bool  # no other stored response of the key names that session


def delete(namespace: str, response_id: str) -> Deleted | None:
    """Forget the caller's stored response; None when it has none of that id (or only
    an expired one, deleted all the same)."""
    with transaction.atomic():
        stored = StoredResponse.objects.filter(id=response_id, namespace=namespace).first()
        if stored is None:
            return None
        stored.delete()
        if stored.created < _cutoff():
            return None
        others = StoredResponse.objects.filter(
            namespace=namespace, model_name=stored.model_name, session_id=stored.session_id
        )
        last = stored.session_id is not None and not others.exists()
    return Deleted(stored.model_name, stored.session_id, last)


def stats() -> dict:
    """What /admin/stats reports: the records and bytes stored, in all and per key
    (namespace), and the limits (expired records are swept first)."""
    prune_expired(force=True)
    per_key = (
        StoredResponse.objects.values("namespace")
        .annotate(count=Count("id"), bytes=Sum("size"))
        .order_by("namespace")
    )
    by_key = [
        {"namespace": row["namespace"], "count": row["count"], "bytes": row["bytes"] or 0}
        for row in per_key
    ]
    return {
        "count": sum(row["count"] for row in by_key),
        "bytes": sum(row["bytes"] for row in by_key),
        "by_key": by_key,
        "limits": {
            "max_item_bytes": settings.PANTHEON_RESPONSES_MAX_ITEM_BYTES,
            "max_bytes_per_key": settings.PANTHEON_RESPONSES_MAX_BYTES_PER_KEY,
            "max_per_key": settings.PANTHEON_RESPONSES_MAX_PER_KEY,
            "ttl_s": settings.PANTHEON_RESPONSES_TTL_S,
        },
    }
