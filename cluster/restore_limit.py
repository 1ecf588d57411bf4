"""The router's /session/restore body limit: the largest one its instances report.

An instance's limit grows with its models' KV size (pantheon_platform/routes.py
restore_body_limit: a whole context window's blob); the router serves no model, so
without this it would refuse at 64 MiB a blob every instance takes. Read from the
registry at most every CACHE_S seconds: the body-limit check runs on the event loop and
in Daphne's header hook, where a Redis round trip per request is not wanted.
"""

from __future__ import annotations

import logging
import threading
import time

log = logging.getLogger("pantheon.cluster")

CACHE_S = 5.0
_lock = threading.Lock()
_cached = (0, -CACHE_S)  # (bytes, when read)


def reported_restore_limit() -> int:
    global _cached
    limit, at = _cached
    if time.monotonic() - at < CACHE_S:
        return limit
    from cluster.registry import get_registry

    try:
        limit = max((i.restore_max_bytes for i in get_registry().instances()), default=0)
    except Exception as exc:  # Redis away: keep the last figure; the forward will say why
        log.warning("restore limit: registry unreadable (%s)", exc)
    with _lock:
        _cached = (limit, time.monotonic())
    return limit


def install() -> None:
    from pantheon_platform import routes

    routes.add_restore_limit_source(reported_restore_limit)
