"""Draining an instance (POST /admin/instances/{id}/drain on the router): no new work goes
to it, its in-flight turns finish, each parked session moves to another live replica of
its model through the instance's POST /admin/session/export and the replica's POST
/session/restore (the blob format: checksummed, the weights version checked by the
restore, and by us first from the reports), the affinity map follows, the source's copy
is released, and the instance is told to stop (POST /admin/shutdown, where it has one).

Synchronous on purpose: it runs in the drain view's own thread (a sync Django view).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field

import httpx
from django.conf import settings

from access import forwarded
from cluster import placement
from cluster.registry import Instance, Registry
from pantheon_platform.errors import ApiError

log = logging.getLogger("pantheon.cluster")

NAMESPACE_HEADER = forwarded.NAMESPACE_HEADER.decode()
PROOF_HEADER = forwarded.PROOF_HEADER.decode()
EXPORT_TIMEOUT_S = 120.0  # a long session's blob is hundreds of MB of base64
BUSY_RETRY_S = 0.2


@dataclass
class DrainReport:
    instance: str
    idle: bool = False  # its in-flight turns finished before the sessions moved
    moved: list[dict] = field(default_factory=list)
    failed: list[dict] = field(default_factory=list)
    stopped: bool = False
    message: str = ""

    def as_json(self) -> dict:
        return {
            "instance": self.instance,
            "draining": True,
            "idle": self.idle,
            "moved": self.moved,
            "failed": self.failed,
            "stopped": self.stopped,
            "message": self.message,
        }


def drain(registry: Registry, instance_id: str, *, timeout_s: float | None = None) -> DrainReport:
    """Drain `instance_id` (404 instance_not_found when no live instance has that id)."""
    inst = registry.instance(instance_id)
    if inst is None:
        raise ApiError(404, f"no live instance {instance_id!r}", "instance_not_found")
    registry.set_draining(inst)
    report = DrainReport(inst.id)
    timeout_s = settings.PANTHEON_DRAIN_TIMEOUT if timeout_s is None else timeout_s
    idle = _wait_idle(registry, inst.id, time.time(), timeout_s)
    report.idle = idle is not None
    inst = idle or registry.instance(instance_id) or inst
    with _client() as client:
        for session in inst.sessions:
            try:
                report.moved.append(_move(client, registry, inst, session))
            except ApiError as error:
                report.failed.append({**session, "error": error.message, "type": error.type})
            except httpx.HTTPError as exc:
                report.failed.append({**session, "error": str(exc), "type": "instance_failed"})
        report.stopped, report.message = _stop(client, inst, report)
    log.info(
        "drained %s: %d sessions moved, %d failed, stopped: %s",
        inst.id,
        len(report.moved),
        len(report.failed),
        report.stopped,
    )
    return report


def _wait_idle(registry: Registry, instance_id: str, since: float, timeout_s: float):
    """The instance's first report sent after `since` that shows nothing in flight (its
    session list then holds every session its last turns parked), or None at the timeout
    or if it went away."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        inst = registry.instance(instance_id)
        if inst is None:
            return None
        if inst.last_heartbeat > since and all(
            m.free_slots == m.max_concurrent and m.queue_depth == 0 for m in inst.models
        ):
            return inst
        time.sleep(min(0.1, settings.PANTHEON_HEARTBEAT_S / 4))
    return None


def _move(client: httpx.Client, registry: Registry, source: Instance, session: dict) -> dict:
    model, sid, namespace = session["model"], session["session_id"], session["namespace"]
    target = placement.choose(registry.instances(), model, {}, exclude=frozenset({source.id}))
    have = source.model(model)
    want = target.model(model)
    if have and want and have.weights_version != want.weights_version:
        raise ApiError(
            409,
            f"{target.id} serves {model} from other weights ({want.weights_version}) than "
            f"{source.id} ({have.weights_version}): the session's KV would not fit them",
            "weights_version_mismatch",
        )
    exported = _call(
        client,
        source,
        "/admin/session/export",
        {"name": model, "session_id": sid, "namespace": namespace},
    )
    restored = _call(
        client,
        target,
        "/session/restore",
        {
            "name": model,
            "session_id": sid,
            "blob": exported["blob_b64"],
            "tokens": exported["tokens"],
        },
        namespace,
    )
    registry.set_session(namespace, sid, target.id)
    _call(client, source, "/session/release", {"name": model, "session_id": sid}, namespace)
    return {
        "session_id": sid,
        "namespace": namespace,
        "model": model,
        "to": target.id,
        "tokens": restored.get("n_tok", exported.get("n_tok")),
    }


def _call(client: httpx.Client, inst: Instance, path: str, body: dict, namespace=None) -> dict:
    """POST to an instance; a session busy with a turn is waited for (bounded by the
    export timeout); any other refusal is raised as the instance's own error."""
    headers = {}
    if namespace:  # the session's namespace, proved as the router proves it (dispatch)
        headers = {NAMESPACE_HEADER: namespace, PROOF_HEADER: forwarded.proof(namespace)}
    deadline = time.monotonic() + EXPORT_TIMEOUT_S
    while True:
        reply = client.post(inst.url + path, json=body, headers=headers)
        if reply.status_code == 429 and time.monotonic() < deadline:
            time.sleep(BUSY_RETRY_S)
            continue
        if reply.is_success:
            return reply.json()
        error = _error_of(reply)
        raise ApiError(
            reply.status_code,
            f"{inst.id}{path}: {error.get('message')}",
            error.get("type") or "instance_failed",
        )


def _stop(client: httpx.Client, inst: Instance, report: DrainReport) -> tuple[bool, str]:
    """Ask the instance to stop gracefully; an instance without the route stays up,
    unrouted (the operator stops it)."""
    moved = f"{len(report.moved)} session(s) moved, {len(report.failed)} not"
    if report.failed:
        return False, f"{moved}: left running (unrouted) so its sessions are not lost"
    try:
        reply = client.post(inst.url + "/admin/shutdown", json={})
    except httpx.HTTPError as exc:
        return False, f"{moved}; asking it to stop failed ({exc}): it stays unrouted"
    if reply.status_code == 404:
        return False, (
            f"{moved}; the instance has no POST /admin/shutdown: it is left running but "
            "unrouted (stop it with SIGTERM)"
        )
    if not reply.is_success:
        return False, f"{moved}; its shutdown answered {reply.status_code}: it stays unrouted"
    return True, f"{moved}; the instance is shutting down gracefully"


def _error_of(reply: httpx.Response) -> dict:
    try:
        error = reply.json().get("error")
    except ValueError:
        error = None
    return error if isinstance(error, dict) else {"message": reply.text[:200]}


def _client() -> httpx.Client:
    key = settings.PANTHEON_ROUTER_KEY
    return httpx.Client(
        timeout=httpx.Timeout(EXPORT_TIMEOUT_S, connect=5.0),
        headers={"Authorization": f"Bearer {key}"} if key else {},
    )
