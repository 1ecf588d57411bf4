"""AccessLog: one structured line per HTTP request, on the logger `pantheon.access`.

The outermost ASGI layer, so every answer is logged, the other layers' refusals included.
The line is a JSON object written when the response has ended, or when the client went
away first (a stream cut short: `"aborted": true`):

    {"method": "POST", "route": "/v1/chat/completions", "status": 200, "bytes": 1234,
     "duration_ms": 812.4, "model": "smollm2-135m-instruct", "session": "5d41402abc4b",
     "key": "ci-runner"}

- `route` is the URL pattern the path matched (`/admin/aliases/<path:alias>`), never the
  raw path, so a client cannot write what it likes into the log; an unknown path is
  "unmatched". On a router, a forwarded request's is "forwarded:" and the pattern it
  has on the instances (`forwarded:/v1/responses/<str:response_id>`).
- `model` and `session` come from the view (pantheon_platform.request_log.note): the served model
  and the first 12 hex characters of the session id's sha256, when the request has them.
- `key` is the label of the API key that authenticated the request (the access guard puts
  it in the scope), never the key.
Never logged: the body (prompts), the query string, any header (Authorization, x-api-key).
"""

from __future__ import annotations

import json
import logging
import re
import time
from datetime import UTC, datetime

from pantheon_platform.request_log import SCOPE_KEY, bind, unbind

log = logging.getLogger("pantheon.access")

# On a router, what a forwarded request's route starts with (pantheon_requests_total
# keeps them apart from the router's own routes and from the instances' counts).
FORWARDED = "forwarded:"
INSTANCE_CLIENT_URLCONFS = ("wire.urls", "sessions.urls")  # the routes a router forwards
KEY_SCOPE = "pantheon.key"  # the key's label, set in place by the guard (access/guard.py)
_METHOD = re.compile(r"[A-Z]{1,16}")


class AccessLog:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        t0 = time.perf_counter()
        noted: dict = {}
        scope = {**scope, SCOPE_KEY: noted}
        state = {"status": None, "bytes": 0, "ended": False}

        async def counting_send(message):
            if message["type"] == "http.response.start":
                state["status"] = message["status"]
            elif message["type"] == "http.response.body":
                state["bytes"] += len(message.get("body", b""))
                if not message.get("more_body", False):
                    state["ended"] = True
            await send(message)

        failed = False
        token = bind(noted)  # for the code that notes an error without the request
        try:
            await self.app(scope, receive, counting_send)
        except BaseException:
            failed = True  # the server answers 500 (or the client is gone): log, re-raise
            raise
        finally:
            unbind(token)
            write(scope, noted, state, failed, time.perf_counter() - t0)


def write(scope: dict, noted: dict, state: dict, failed: bool, seconds: float) -> None:
    """The request's log line, and its counts in the metrics and usage stats
    (observability.recording). Never raises: neither may be why a request fails."""
    route = "unmatched"
    try:
        route = route_of(scope.get("path", ""))
        log.info(_line(scope, noted, state, failed, seconds, route))
    except Exception:
        logging.getLogger("pantheon.http").exception("access log line failed")
    from observability import recording

    recording.request_ended(
        route=route,
        status=_status(state, failed),
        key=key_label(scope.get(KEY_SCOPE)) or "",
        noted=noted,
        seconds=seconds,
    )


def _status(state: dict, failed: bool) -> int | None:
    status = state["status"]
    return 500 if status is None and failed else status


def _line(
    scope: dict, noted: dict, state: dict, failed: bool, seconds: float, route: str | None = None
) -> str:
    status = _status(state, failed)
    method = scope.get("method", "")
    line = {
        # When the response ended, UTC to the millisecond (the line is written then).
        "ts": datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z"),
        "method": method if _METHOD.fullmatch(method) else "other",
        "route": route if route is not None else route_of(scope.get("path", "")),
        "status": status,
        "bytes": state["bytes"],
        "duration_ms": round(seconds * 1000, 1),
    }
    if "model" in noted:
        line["model"] = noted["model"]
    if "session" in noted:
        line["session"] = noted["session"]
    if "config" in noted:  # the audit of PATCH /admin/config: {name: [old, new]}
        line["config"] = noted["config"]
    key = key_label(scope.get(KEY_SCOPE))
    if key:
        line["key"] = key
    if not state["ended"]:
        line["aborted"] = True
    return json.dumps(line, separators=(",", ":"), ensure_ascii=True)


def route_of(path: str) -> str:
    """The route `path` belongs to, as its URL pattern; "unmatched" for anything else."""
    if _router_forwards(path):
        return FORWARDED + _instance_route(path)
    if path == "/session/watch":  # a Channels consumer, outside Django's URLconf
        return path
    if path.startswith("/static/"):
        return "/static/*"
    from django.urls import Resolver404, resolve

    try:
        match = resolve(path)
    except (Resolver404, ValueError):
        return "unmatched"
    if match.url_name is None and match.route in ("", "^"):
        return "unmatched"  # the catch-all JSON 404
    return "/" + match.route.removeprefix("^")


def _router_forwards(path: str) -> bool:
    from django.conf import settings

    if settings.PANTHEON_ROLE != "router":
        return False
    from cluster.dispatch import is_forwarded

    return is_forwarded(path)


def _instance_route(path: str) -> str:
    """A forwarded path's route in the serve instances' URL table (the router's own has
    none of them): the line an instance writes for the same request names it too."""
    if path == "/session/watch":
        return path
    from django.urls import Resolver404, resolve

    for urlconf in INSTANCE_CLIENT_URLCONFS:
        try:
            return "/" + resolve(path, urlconf).route.removeprefix("^")
        except (Resolver404, ValueError):
            continue
    return "unmatched"


def key_label(label: object) -> str | None:
    """The key's label the guard left in the scope, at most 64 characters."""
    return label[:64] if isinstance(label, str) and label else None
