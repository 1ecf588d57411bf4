"""The router's own routes (PANTHEON_ROLE=router; cluster/urls.py):

POST /registry/register, /registry/heartbeat, /registry/deregister  serve instances
GET  /v1/models (/models), /v1/models/{id}    the models of the live instances, aggregated
GET  /, /health                               the router's health
GET  /admin/instances                         each instance: models, slots, heartbeat, sessions
POST /admin/instances/{id}/drain              move its sessions elsewhere, then stop it

Sync views: each Redis call is a loopback round trip, and a drain takes as long as its
sessions' blobs take to move; Django gives each its own thread.
"""

from __future__ import annotations

import time

from django.conf import settings
from rest_framework.response import Response
from rest_framework.views import APIView

from cluster import cluster_secret, migration
from cluster.registry import Instance, get_registry, registry_unavailable
from cluster.reports import parse_report
from pantheon_platform.errors import ApiError, invalid_request
from pantheon_platform.strict_json import IDENTIFIER_MAX, parse_json_object


class RouterView(APIView):
    """The registry unreachable is a 503 registry_unavailable, not a 500."""

    def handle_exception(self, exc):
        import redis

        if isinstance(exc, redis.RedisError):
            exc = registry_unavailable(exc)
        return super().handle_exception(exc)


class RegisterView(RouterView):
    """POST /registry/register: a serve instance announces itself (cluster/reports.py)."""

    def post(self, request):
        report = parse_report(parse_json_object(request.body))
        cluster_secret.check(request, report["id"], report["started_at"])
        registry = get_registry()
        cluster_secret.refuse_takeover(registry.document(report["id"]), report)
        registry.put(report)
        return Response(
            {
                "registered": True,
                "id": report["id"],
                "heartbeat_s": settings.PANTHEON_HEARTBEAT_S,
                "heartbeat_timeout_s": settings.PANTHEON_HEARTBEAT_TIMEOUT_S,
            }
        )


class HeartbeatView(RouterView):
    """POST /registry/heartbeat: the same report, every few seconds. 404 unknown_instance
    when the router has dropped the instance (its heartbeats lapsed): register again."""

    def post(self, request):
        report = parse_report(parse_json_object(request.body))
        cluster_secret.check(request, report["id"], report["started_at"])
        registry = get_registry()
        live = registry.document(report["id"])
        if live is None:
            raise ApiError(
                404,
                f"instance {report['id']!r} is not registered (its heartbeats lapsed, "
                f"{settings.PANTHEON_HEARTBEAT_TIMEOUT_S:g} s); register again",
                "unknown_instance",
            )
        cluster_secret.refuse_takeover(live, report)
        registry.put(report)
        return Response({"ok": True})


class DeregisterView(RouterView):
    """POST /registry/deregister {"id", "started_at"}: a graceful stop began; no new work
    goes there. Only the live process itself (its started_at and token) may."""

    def post(self, request):
        body = parse_json_object(request.body)
        instance_id, started_at = body.get("id"), body.get("started_at")
        if not isinstance(instance_id, str) or not 0 < len(instance_id) <= IDENTIFIER_MAX:
            raise invalid_request(f"id: expected a non-empty string of at most {IDENTIFIER_MAX}")
        if isinstance(started_at, bool) or not isinstance(started_at, int | float):
            raise invalid_request("started_at: expected the instance's start time (a number)")
        cluster_secret.check(request, instance_id, started_at)
        registry = get_registry()
        cluster_secret.refuse_takeover(registry.document(instance_id), body)
        registry.remove(instance_id)
        return Response({"deregistered": True, "id": instance_id})


def model_rows(instances: list[Instance]) -> list[dict]:
    """The contract's router /v1/models rows: per served id, `live` (routable instances
    serving it), `free_slots` summed over them, `context_window` the minimum over them
    and left out when any of them has not reported one."""
    rows: dict[str, dict] = {}
    windows: dict[str, list[int | None]] = {}
    for inst in instances:
        if not inst.routable:
            continue
        for m in inst.models:
            row = rows.setdefault(
                m.id,
                {
                    "id": m.id,
                    "object": "model",
                    "created": 0,
                    "owned_by": "pantheon",
                    "live": 0,
                    "free_slots": 0,
                },
            )
            row["live"] += 1
            row["free_slots"] += m.free_slots
            windows.setdefault(m.id, []).append(m.context_window)
    for name, row in rows.items():
        if None not in windows[name]:
            row["context_window"] = min(windows[name])
    return [rows[name] for name in sorted(rows)]


class ModelsView(RouterView):
    """GET /v1/models (and /models) on the router."""

    def get(self, request):
        return Response({"object": "list", "data": model_rows(get_registry().instances())})


class ModelView(RouterView):
    """GET /v1/models/{id} on the router: its aggregated row, 503 no_live_instance when no
    live instance serves it."""

    def get(self, request, model_id: str):
        instances = get_registry().instances()
        for row in model_rows(instances):
            if row["id"] == model_id:
                return Response(row)
        from cluster.placement import no_live_instance

        raise no_live_instance(model_id, instances)


class HealthView(RouterView):
    """GET / on the router: its role, the live instances and the models they serve (each
    "loaded" where a routable instance serves it)."""

    def get(self, request):
        instances = get_registry().instances()
        models = {row["id"]: "loaded" for row in model_rows(instances)}
        return Response(
            {"status": "ok", "role": "router", "instances": len(instances), "models": models}
        )


class LlamaHealthView(RouterView):
    """GET /health: 200 while some routable instance serves a model, else 503."""

    def get(self, request):
        if model_rows(get_registry().instances()):
            return Response({"status": "ok"})
        return Response(
            {"error": {"code": 503, "message": "No live instance", "type": "unavailable_error"}},
            status=503,
        )


def instance_row(inst: Instance, now: float) -> dict:
    """One instance as /admin/instances and the console show it."""
    return {
        "id": inst.id,
        "url": inst.url,
        "state": "draining" if inst.draining else "stopping" if inst.stopping else "live",
        "last_heartbeat": inst.last_heartbeat,
        "last_heartbeat_age_s": round(max(0.0, now - inst.last_heartbeat), 3),
        "started_at": inst.started_at,
        "models": [
            {
                "id": m.id,
                "max_concurrent": m.max_concurrent,
                "free_slots": m.free_slots,
                "queue_depth": m.queue_depth,
                "context_window": m.context_window,
                "sessions": m.sessions,
            }
            for m in inst.models
        ],
        "sessions": list(inst.sessions),
    }


class InstancesView(RouterView):
    """GET /admin/instances: every live instance (heartbeats not lapsed)."""

    def get(self, request):
        now = time.time()
        rows = [instance_row(i, now) for i in get_registry().instances()]
        return Response(
            {
                "object": "list",
                "heartbeat_timeout_s": settings.PANTHEON_HEARTBEAT_TIMEOUT_S,
                "data": rows,
            }
        )


class DrainView(RouterView):
    """POST /admin/instances/{id}/drain: cluster/migration.py."""

    def post(self, request, instance_id: str):
        return Response(migration.drain(get_registry(), instance_id).as_json())
