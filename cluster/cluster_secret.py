"""The shared secret of one cluster (PANTHEON_CLUSTER_SECRET, the same on the router and
every instance): an instance proves with it that it belongs, so no local process can
register a rogue instance, and a registration proves with it that it is the process it
claims to be, so no one can take over a live instance's id.

The secret itself never travels: each registry call carries an HMAC of the instance's id
and `started_at` (X-Pantheon-Cluster-Token), which only a holder of the secret can make.
"""

from __future__ import annotations

import hashlib
import hmac

from django.conf import settings

from pantheon_platform.errors import ApiError

TOKEN_HEADER = "X-Pantheon-Cluster-Token"


def token(instance_id: str, started_at: float, secret: str | None = None) -> str:
    """The proof that the process `instance_id` started at `started_at` holds the secret."""
    key = (secret if secret is not None else settings.PANTHEON_CLUSTER_SECRET).encode()
    message = f"{instance_id}\n{float(started_at)!r}".encode()
    return hmac.new(key, message, hashlib.sha256).hexdigest()


def check(request, instance_id: str, started_at: float) -> None:
    """403 cluster_secret_required unless the request carries the token of this id and
    start: made with the router's secret."""
    sent = request.headers.get(TOKEN_HEADER, "")
    if not hmac.compare_digest(sent.encode(), token(instance_id, started_at).encode()):
        raise ApiError(
            403,
            f"registry call for {instance_id!r} without a valid {TOKEN_HEADER}: instances "
            "must hold the cluster's PANTHEON_CLUSTER_SECRET",
            "cluster_secret_required",
        )


def refuse_takeover(live: dict | None, report: dict) -> None:
    """409 instance_id_taken when `report` names an instance whose heartbeats are current
    but comes from another process (another started_at), unless it is that instance's
    restart: the same id at the same URL, started later. The process it replaces cannot
    still be serving there (its successor holds the address), so the router sends nothing
    more to it; without this the restart would wait out the old heartbeats while requests
    went to its address, where the new process is still loading."""
    if live is None or float(live["started_at"]) == float(report["started_at"]):
        return
    restart = report.get("url") == live.get("url") and float(report["started_at"]) > float(
        live["started_at"]
    )
    if not restart:
        raise ApiError(
            409,
            f"instance {report['id']!r} is live (started at {live['started_at']!r}); a "
            "registration under its id is refused until its heartbeats lapse",
            "instance_id_taken",
        )
