"""The cluster's shared state in Redis, so that several routers see one view and a router
restart loses nothing. Every key has a TTL:

pantheon:instance:<id>       the instance's last registration or heartbeat (JSON); expires
                             PANTHEON_HEARTBEAT_TIMEOUT_MS after it: a silent instance is
                             dropped by Redis itself, whichever router was watching
pantheon:instances           the ids ever registered (a set; an id whose document expired
                             is pruned when listed)
pantheon:draining:<id>       set by a drain: no new work goes there (the started_at of the
                             process drained, so a restarted instance under the same id
                             serves again)
pantheon:session:<ns>:<sid>  the instance holding a session (its caller's namespace and
                             id); refreshed on every turn, PANTHEON_AFFINITY_TTL_MS
pantheon:response:<ns>:<id>  the instance that stored a /v1/responses response (GET,
                             DELETE and previous_response_id go there)
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass, field

from django.conf import settings

from pantheon_platform.errors import ApiError

PREFIX = "pantheon:"
INSTANCES = PREFIX + "instances"
RESPONSE_TTL_S = 30 * 86400  # a stored response is kept by its instance until deleted


@dataclass(frozen=True)
class ModelReport:
    """One model as an instance reports it (its /v1/models row plus the load)."""

    id: str
    max_concurrent: int
    free_slots: int
    queue_depth: int
    queue_capacity: int
    sessions: int
    weights_version: str = ""
    context_window: int | None = None  # None: not reported

    @property
    def full(self) -> bool:
        """No free slot and no room in its queue: a request there would be refused."""
        return self.free_slots <= 0 and self.queue_depth >= self.queue_capacity


@dataclass(frozen=True)
class Instance:
    id: str
    url: str
    started_at: float
    last_heartbeat: float
    models: tuple[ModelReport, ...]
    aliases: dict = field(default_factory=dict)
    sessions: tuple[dict, ...] = ()  # {"session_id", "namespace", "model", "tokens"}
    stopping: bool = False  # the instance itself is shutting down
    draining: bool = False  # a router drained it
    restore_max_bytes: int = 0  # its /session/restore body limit (0: not reported)

    @property
    def routable(self) -> bool:
        return not (self.stopping or self.draining)

    def model(self, name: str) -> ModelReport | None:
        name = self.aliases.get(name, name)
        return next((m for m in self.models if m.id == name), None)

    def as_json(self) -> dict:
        return {
            "id": self.id,
            "url": self.url,
            "started_at": self.started_at,
            "last_heartbeat": self.last_heartbeat,
            "models": [_model_json(m) for m in self.models],
            "aliases": self.aliases,
            "sessions": list(self.sessions),
            "stopping": self.stopping,
            "draining": self.draining,
            "restore_max_bytes": self.restore_max_bytes,
        }


def _model_json(m: ModelReport) -> dict:
    row = {
        "id": m.id,
        "max_concurrent": m.max_concurrent,
        "free_slots": m.free_slots,
        "queue_depth": m.queue_depth,
        "queue_capacity": m.queue_capacity,
        "sessions": m.sessions,
        "weights_version": m.weights_version,
    }
    if m.context_window is not None:
        row["context_window"] = m.context_window
    return row


def instance_from_json(doc: dict, draining: bool = False) -> Instance:
    models = tuple(
        ModelReport(
            id=m["id"],
            max_concurrent=m["max_concurrent"],
            free_slots=m["free_slots"],
            queue_depth=m["queue_depth"],
            queue_capacity=m["queue_capacity"],
            sessions=m.get("sessions", 0),
            weights_version=m.get("weights_version", ""),
            context_window=m.get("context_window"),
        )
        for m in doc["models"]
    )
    return Instance(
        id=doc["id"],
        url=doc["url"],
        started_at=doc["started_at"],
        last_heartbeat=doc["last_heartbeat"],
        models=models,
        aliases=dict(doc.get("aliases") or {}),
        sessions=tuple(doc.get("sessions") or ()),
        stopping=bool(doc.get("stopping")),
        draining=draining,
        restore_max_bytes=int(doc.get("restore_max_bytes") or 0),
    )


class Registry:
    """The Redis view (a redis-py client; every call is one or two round trips)."""

    def __init__(self, client, heartbeat_timeout_s: float, affinity_ttl_s: float):
        self.redis = client
        self.timeout_ms = max(1, int(heartbeat_timeout_s * 1000))
        self.affinity_ttl_ms = max(1, int(affinity_ttl_s * 1000))

    # ---- instances ----

    def put(self, doc: dict) -> None:
        """Store a registration or heartbeat (already validated: cluster.reports)."""
        doc = {**doc, "last_heartbeat": time.time()}
        pipe = self.redis.pipeline()
        pipe.set(PREFIX + "instance:" + doc["id"], json.dumps(doc), px=self.timeout_ms)
        pipe.sadd(INSTANCES, doc["id"])
        pipe.execute()

    def document(self, instance_id: str) -> dict | None:
        """The instance's last report while its heartbeats are current, else None."""
        raw = self.redis.get(PREFIX + "instance:" + instance_id)
        return json.loads(raw) if raw is not None else None

    def known(self, instance_id: str) -> bool:
        """Its heartbeats have not lapsed (a heartbeat after that must register again)."""
        return bool(self.redis.exists(PREFIX + "instance:" + instance_id))

    def remove(self, instance_id: str) -> None:
        pipe = self.redis.pipeline()
        pipe.delete(PREFIX + "instance:" + instance_id)
        pipe.srem(INSTANCES, instance_id)
        pipe.execute()

    def instances(self) -> list[Instance]:
        """Every instance whose heartbeats have not lapsed, by id."""
        ids = sorted(self.redis.smembers(INSTANCES))
        if not ids:
            return []
        pipe = self.redis.pipeline()
        for i in ids:
            pipe.get(PREFIX + "instance:" + i)
            pipe.get(PREFIX + "draining:" + i)
        values = pipe.execute()
        found, lapsed = [], []
        for i, doc, drained in zip(ids, values[::2], values[1::2], strict=True):
            if doc is None:
                lapsed.append(i)
                continue
            doc = json.loads(doc)
            draining = drained is not None and float(drained) == doc["started_at"]
            found.append(instance_from_json(doc, draining))
        if lapsed:
            self.redis.srem(INSTANCES, *lapsed)
        return found

    def instance(self, instance_id: str) -> Instance | None:
        return next((i for i in self.instances() if i.id == instance_id), None)

    def set_draining(self, inst: Instance) -> None:
        """No new work to this process from now on (every router reads the flag)."""
        self.redis.set(
            PREFIX + "draining:" + inst.id, repr(inst.started_at), px=RESPONSE_TTL_S * 1000
        )

    # ---- affinity ----

    def session_instance(self, namespace: str, session_id: str) -> str | None:
        return self.redis.get(_session_key(namespace, session_id))

    def set_session(self, namespace: str, session_id: str, instance_id: str) -> None:
        self.redis.set(_session_key(namespace, session_id), instance_id, px=self.affinity_ttl_ms)

    def response_instance(self, namespace: str, response_id: str) -> str | None:
        return self.redis.get(_response_key(namespace, response_id))

    def set_response(self, namespace: str, response_id: str, instance_id: str) -> None:
        self.redis.set(_response_key(namespace, response_id), instance_id, px=RESPONSE_TTL_S * 1000)


def _session_key(namespace: str, session_id: str) -> str:
    return f"{PREFIX}session:{namespace}:{session_id}"


def _response_key(namespace: str, response_id: str) -> str:
    return f"{PREFIX}response:{namespace}:{response_id}"


_lock = threading.Lock()
_registry: Registry | None = None


def get_registry() -> Registry:
    """The process's Registry on PANTHEON_REDIS_URL (one connection pool, made on first
    use; redis-py's client is thread-safe)."""
    global _registry
    with _lock:
        if _registry is None:
            import redis

            client = redis.Redis.from_url(
                settings.PANTHEON_REDIS_URL,
                decode_responses=True,
                socket_timeout=5,
                socket_connect_timeout=2,
                health_check_interval=30,
            )
            _registry = Registry(
                client, settings.PANTHEON_HEARTBEAT_TIMEOUT_S, settings.PANTHEON_AFFINITY_TTL_S
            )
        return _registry


def registry_unavailable(exc: Exception) -> ApiError:
    """Redis unreachable: 503, never a 500 (the router's routes and its dispatch)."""
    return ApiError(
        503,
        f"the router cannot reach its registry (Redis, PANTHEON_REDIS_URL): {exc}",
        "registry_unavailable",
        headers={"Retry-After": "1"},
    )
