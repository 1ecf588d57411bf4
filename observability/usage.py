"""Usage per (key, model, hour): counted in memory by `add` (on the event loop: a dict
update under a lock, no database), written to UsageBucket rows by `flush`.

`flush` runs every FLUSH_EVERY_S on the flusher thread (started with the server by
pantheon_site.asgi), at the end of the SIGTERM drain (apps.py), and before GET
/admin/stats reads. A failed write is logged and its counts go back into the buffer for
the next flush; nothing here ever raises into a request.

Bounded by two settings: hour rows older than PANTHEON_STATS_RETENTION_DAYS are rolled
up into one row per key, model and day; day rows older than PANTHEON_STATS_DAYS_KEPT are
deleted (`prune`, at most every PRUNE_EVERY_S, after a flush).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import astuple, dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.db import connections, transaction
from django.db.models import F

from observability.models import DAY, HOUR, UsageBucket

log = logging.getLogger("pantheon.usage")

FLUSH_EVERY_S = 5.0
PRUNE_EVERY_S = 3600.0


@dataclass
class Counts:
    requests: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    errors: int = 0

    def add(self, other: Counts) -> None:
        for name in UsageBucket.COUNTS:
            setattr(self, name, getattr(self, name) + getattr(other, name))


_lock = threading.Lock()
_pending: dict[tuple[str, str, datetime], Counts] = {}
_flush_lock = threading.Lock()  # one flush at a time (the thread, the drain, a stats read)
_last_prune = 0.0


def hour_of(when: datetime) -> datetime:
    return when.astimezone(UTC).replace(minute=0, second=0, microsecond=0)


def add(key: str, model: str, counts: Counts, when: datetime | None = None) -> None:
    """Count one request's usage in its hour (now, unless `when`)."""
    bucket = (key, model, hour_of(when or datetime.now(UTC)))
    with _lock:
        _pending.setdefault(bucket, Counts()).add(counts)


def flush() -> int:
    """Write the buffered counts; returns how many buckets were written. Raises the
    database's error after putting the counts back in the buffer."""
    with _flush_lock:
        with _lock:
            taken = dict(_pending)
            _pending.clear()
        try:
            if taken:
                with transaction.atomic():
                    for (key, model, start), counts in taken.items():
                        _add_to_row(key, model, HOUR, start, counts)
        except Exception:
            with _lock:
                for bucket, counts in taken.items():
                    _pending.setdefault(bucket, Counts()).add(counts)
            raise
        _prune_when_due()
        return len(taken)


def flush_quietly() -> bool:
    """flush, its failure logged (the drain's hook, the flusher thread); False if it
    failed."""
    try:
        flush()
    except Exception:
        log.exception("usage stats: the write failed; the counts are kept for the next one")
        return False
    return True


def _add_to_row(key: str, model: str, span: str, start: datetime, counts: Counts) -> None:
    row, created = UsageBucket.objects.get_or_create(
        key=key, model=model, span=span, start=start, defaults=_fields(counts)
    )
    if not created:
        UsageBucket.objects.filter(pk=row.pk).update(
            **{name: F(name) + value for name, value in _fields(counts).items()}
        )


def _fields(counts: Counts) -> dict[str, int]:
    return dict(zip(UsageBucket.COUNTS, astuple(counts), strict=True))


def _prune_when_due() -> None:
    global _last_prune
    now = time.monotonic()
    if _last_prune and now - _last_prune < PRUNE_EVERY_S:
        return
    _last_prune = now
    prune(datetime.now(UTC))


def prune(now: datetime) -> None:
    """Roll hour rows older than PANTHEON_STATS_RETENTION_DAYS into day rows; delete day
    rows older than PANTHEON_STATS_DAYS_KEPT."""
    hours_before = hour_of(now) - timedelta(days=settings.PANTHEON_STATS_RETENTION_DAYS)
    days_before = hour_of(now) - timedelta(days=settings.PANTHEON_STATS_DAYS_KEPT)
    with transaction.atomic():
        old = UsageBucket.objects.filter(span=HOUR, start__lt=hours_before)
        days: dict[tuple[str, str, datetime], Counts] = {}
        for row in old:
            day = row.start.astimezone(UTC).replace(hour=0)
            counts = Counts(*(getattr(row, name) for name in UsageBucket.COUNTS))
            days.setdefault((row.key, row.model, day), Counts()).add(counts)
        for (key, model, day), counts in days.items():
            _add_to_row(key, model, DAY, day, counts)
        old.delete()
        UsageBucket.objects.filter(span=DAY, start__lt=days_before).delete()


class _Flusher:
    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, name="pantheon-usage", daemon=True)

    def _run(self) -> None:
        try:
            while not self.stop.wait(self.interval):
                if not flush_quietly():
                    connections.close_all()  # a broken connection is reopened next time
        finally:
            connections.close_all()


_flusher: _Flusher | None = None


def start_flusher(interval: float = FLUSH_EVERY_S) -> None:
    """Flush every `interval` seconds on a thread of its own (idempotent)."""
    global _flusher
    if _flusher is None:
        _flusher = _Flusher(interval)
        _flusher.thread.start()
