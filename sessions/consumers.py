"""GET /session/watch: a liveness hold on a session, as a long-held event stream.

A Channels consumer rather than a Django view: the response stays open until the client
goes, and the consumer must see that moment (`http.disconnect`) to drop the hold. While
the watch is held the session is never reaped for idleness; once it closes, the session
is dropped after the grace period (PN_SESSION_WATCH_GRACE_MS) unless watched again.
A watch holds the caller's own session of the id (its key's namespace, pantheon_platform/tenancy.py),
and counts against that key's watch cap (PANTHEON_KEY_MAX_WATCHES).

It bypasses Django's middleware, so it sets the CORS and `Connection: close` headers and
answers the OPTIONS preflight itself, as pantheon_platform.middleware does for every other route.
"""

from __future__ import annotations

import asyncio
import json
import logging
from urllib.parse import parse_qs

from channels.exceptions import StopConsumer
from channels.generic.http import AsyncHttpConsumer

from pantheon_platform import tenancy
from pantheon_platform.errors import ApiError, api_error_from, invalid_request, method_not_allowed
from pantheon_platform.runtime import get_runtime
from pantheon_platform.tenancy import SESSION_ID_MAX

log = logging.getLogger("pantheon.http")

KEEPALIVE_S = 15.0  # a comment line this often keeps proxies from closing an idle stream
ESTABLISHED = b": watch established\n\n"
KEEPALIVE = b": keepalive\n\n"
_COMMON_HEADERS = [(b"access-control-allow-origin", b"*"), (b"connection", b"close")]


class SessionWatchConsumer(AsyncHttpConsumer):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._watching = None  # (service, session id) while this consumer holds a watch
        self._keepalive: asyncio.Task | None = None

    async def __call__(self, scope, receive, send):
        try:
            await super().__call__(scope, receive, send)
        finally:
            # Also when the server cancels the consumer rather than reporting a disconnect.
            self._end_watch()

    async def http_request(self, message):
        # The stock handler ends the consumer as soon as the request is answered; a watch
        # that was established must instead stay open until http.disconnect.
        if "body" in message:
            self.body.append(message["body"])
        if message.get("more_body"):
            return
        method = self.scope.get("method", "")
        if method == "OPTIONS":
            await self._send_preflight()
            raise StopConsumer()
        try:
            self._watching = self._watch(method)
        except Exception as exc:
            error = api_error_from(exc)
            if error.status == 500:
                log.error("GET /session/watch failed", exc_info=exc)
            await self._send_error(error)
            raise StopConsumer() from None
        await self.send_headers(
            status=200,
            headers=[
                (b"content-type", b"text/event-stream"),
                (b"cache-control", b"no-cache"),
                (b"x-accel-buffering", b"no"),
                *_COMMON_HEADERS,
            ],
        )
        await self.send_body(ESTABLISHED, more_body=True)
        self._keepalive = asyncio.ensure_future(self._send_keepalives())

    async def disconnect(self):
        self._end_watch()

    def _watch(self, method: str):
        """Take the hold: (the model's service, the session id), or an ApiError / engine
        error for the error response."""
        if method != "GET":
            raise method_not_allowed(method, ["GET", "OPTIONS"])
        query = parse_qs(self.scope.get("query_string", b"").decode("latin-1"))
        sid = (query.get("session_id") or [""])[0] or self._header(b"x-session-id")
        if not sid:
            raise invalid_request(
                "session_id: required (the session_id query parameter or X-Session-Id)"
            )
        if len(sid) > SESSION_ID_MAX:
            raise invalid_request(f"session_id: at most {SESSION_ID_MAX} characters")
        name = (query.get("name") or [""])[0] or None
        # A dict lookup under the registry's lock: fine on the event loop.
        served, svc = get_runtime().resolve(name)
        if not svc.sessions.enabled:
            raise ApiError(
                400,
                f"model {served!r} has no session cache (max_sessions is 0)",
                "session_caching_disabled",
            )
        key = tenancy.session_key(self.scope, sid)  # the caller's own session of that id
        svc.sessions.watch(key)  # WatchUnavailable: 503 watch_unavailable
        # Keep the service resolved now: the unwatch must reach the same table even if
        # the model is unloaded, or another one takes its name, meanwhile.
        return svc, key

    async def _send_keepalives(self) -> None:
        try:
            while True:
                await asyncio.sleep(KEEPALIVE_S)
                await self.send_body(KEEPALIVE, more_body=True)
        except asyncio.CancelledError:
            raise
        except Exception:  # the connection is gone; the disconnect ends the watch
            log.debug("session watch keepalive stopped", exc_info=True)

    def _end_watch(self) -> None:
        """Drop the hold (exactly once) and stop the keepalives."""
        if self._keepalive is not None:
            self._keepalive.cancel()
            self._keepalive = None
        watching, self._watching = self._watching, None
        if watching is not None:
            svc, sid = watching
            svc.sessions.unwatch(sid)

    def _header(self, name: bytes) -> str:
        for key, value in self.scope.get("headers", []):
            if key.lower() == name:
                return value.decode("latin-1")
        return ""

    async def _send_error(self, error: ApiError) -> None:
        body = json.dumps(error.body(), separators=(",", ":")).encode()
        headers = [(b"content-type", b"application/json"), *_COMMON_HEADERS]
        headers += [(k.lower().encode(), v.encode("latin-1")) for k, v in error.headers.items()]
        await self.send_response(error.status, body, headers=headers)

    async def _send_preflight(self) -> None:
        # The same answer pantheon_platform.middleware.CorsMiddleware gives on every other path.
        requested = self._header(b"access-control-request-headers") or "*"
        headers = [
            (b"content-type", b"application/json"),
            (b"access-control-allow-methods", b"GET, POST, DELETE, OPTIONS"),
            (b"access-control-allow-headers", requested.encode("latin-1")),
            (b"access-control-max-age", b"86400"),
            *_COMMON_HEADERS,
        ]
        await self.send_response(200, b"{}", headers=headers)
