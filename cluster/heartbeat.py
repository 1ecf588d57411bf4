"""A serve instance's side of the registry: given PANTHEON_ROUTER_URL, register with the
router at start, heartbeat every PANTHEON_HEARTBEAT_MS with what it serves and how loaded
it is, and deregister when a graceful stop begins (so no new work is sent while it
drains). One daemon thread; the router being down only delays registration (retried).
"""

from __future__ import annotations

import logging
import sys
import threading
import time
from urllib.parse import urlsplit

import httpx
from django.conf import settings

from cluster import cluster_secret
from pantheon_platform import routes, shutdown
from pantheon_platform.runtime import get_runtime

log = logging.getLogger("pantheon.cluster")

REQUEST_TIMEOUT_S = 5.0
MAX_REPORTED_SESSIONS = 10_000  # cluster.reports.MAX_SESSIONS is the router's bound


def instance_url() -> str:
    """PANTHEON_INSTANCE_URL, else Daphne's -b/-p from the command line (a wildcard bind
    is reached on 127.0.0.1)."""
    if settings.PANTHEON_INSTANCE_URL:
        return settings.PANTHEON_INSTANCE_URL
    host, port = "127.0.0.1", "8000"
    argv = sys.argv
    for i, arg in enumerate(argv[:-1]):
        if arg in ("-b", "--bind"):
            host = argv[i + 1]
        elif arg in ("-p", "--port"):
            port = argv[i + 1]
    if host in ("0.0.0.0", "::", ""):
        host = "127.0.0.1"
    return f"http://{host}:{port}"


def model_reports() -> tuple[list[dict], list[dict]]:
    """(models, sessions) as the registry reports carry them (cluster/reports.py)."""
    models, sessions = [], []
    for name, svc in sorted(get_runtime().services().items()):
        held = svc.session_info() if svc.sessions.enabled else []
        row = {
            "id": name,
            "max_concurrent": svc.max_concurrent,
            "free_slots": max(0, svc.max_concurrent - svc.scheduler.running),
            "queue_depth": svc.queued,
            "queue_capacity": svc.scheduler.queue_depth,
            "sessions": len(held),
            "weights_version": svc.weights_version,
        }
        if svc.context_window:  # omitted when unknown, as on /v1/models
            row["context_window"] = svc.context_window
        models.append(row)
        sessions.extend(
            {
                "session_id": info.session_id.id,
                "namespace": info.namespace,
                "model": name,
                "tokens": info.tokens,
            }
            for info in held
        )
    return models, sessions[:MAX_REPORTED_SESSIONS]


class Heartbeat(threading.Thread):
    """Registers, then heartbeats until stop(); re-registers when the router has dropped
    this instance (its heartbeats lapsed, or the router's Redis was emptied)."""

    def __init__(self, router_url: str, url: str, instance_id: str, interval_s: float):
        super().__init__(name="pantheon-heartbeat", daemon=True)
        self.router_url, self.url, self.instance_id = router_url, url, instance_id
        self.interval_s = interval_s
        self.started_at = time.time()
        self._stop = threading.Event()
        headers = {cluster_secret.TOKEN_HEADER: cluster_secret.token(instance_id, self.started_at)}
        if settings.PANTHEON_ROUTER_KEY:
            headers["Authorization"] = f"Bearer {settings.PANTHEON_ROUTER_KEY}"
        self.client = httpx.Client(timeout=REQUEST_TIMEOUT_S, headers=headers)

    def report(self) -> dict:
        models, sessions = model_reports()
        return {
            "id": self.instance_id,
            "url": self.url,
            "started_at": self.started_at,
            "stopping": shutdown.draining(),
            "models": models,
            "aliases": get_runtime().aliases(),
            "sessions": sessions,
            "restore_max_bytes": routes.restore_body_limit(),
        }

    def run(self) -> None:
        registered, failing = False, False
        while not self._stop.is_set():
            route = "/registry/heartbeat" if registered else "/registry/register"
            try:
                reply = self.client.post(self.router_url + route, json=self.report())
                if reply.status_code == 404 and registered:
                    registered = False  # dropped by the router: register again at once
                    continue
                reply.raise_for_status()
                if not registered:
                    log.info("registered with the router %s as %s", self.router_url, self.url)
                registered, failing = True, False
            except Exception as exc:  # the router down or refusing: retried, logged once
                if not failing:
                    log.warning("router %s%s: %s (retrying)", self.router_url, route, exc)
                failing = True
            self._stop.wait(self.interval_s)

    def stop(self) -> None:
        """Stop heartbeating and deregister (best effort: else the router drops this
        instance when its heartbeats lapse)."""
        self._stop.set()
        try:
            self.client.post(
                self.router_url + "/registry/deregister",
                json={"id": self.instance_id, "started_at": self.started_at},
            )
        except Exception as exc:
            log.warning("deregistering from %s: %s", self.router_url, exc)


def install() -> Heartbeat | None:
    """Start heartbeating when PANTHEON_ROUTER_URL is set (pantheon_site.asgi, serve role),
    and deregister when a graceful stop begins."""
    if not settings.PANTHEON_ROUTER_URL:
        return None
    logging.getLogger("httpx").setLevel(logging.WARNING)  # not a line per heartbeat
    url = instance_url()
    beat = Heartbeat(
        settings.PANTHEON_ROUTER_URL,
        url,
        settings.PANTHEON_INSTANCE_ID or urlsplit(url).netloc,
        settings.PANTHEON_HEARTBEAT_S,
    )
    shutdown.add_on_drain(beat.stop)
    beat.start()
    return beat
