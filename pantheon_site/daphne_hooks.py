"""Daphne and Twisted, hooked where the ASGI layers cannot reach: before the body is read,
when the request cannot be parsed, and in their own access logs.

Installed once by pantheon_site.asgi (so `daphne pantheon_site.asgi:application`, `make
serve` and the tests' servers all get it), before Daphne builds its HTTP factory:

- Refuse before spooling. Twisted reads a whole request body before Daphne calls the
  application, spilling past 100 KB to a temporary file. Our request class
  (PantheonRequest, a subclass of Daphne's WebRequest) decides in `gotLength`, which runs
  once the headers are in and before any body byte is stored: a declared Content-Length
  over the route's limit (pantheon_platform.routes.body_limit) is 413, and the access guard's
  checks that need no database (access.guard.check_now: Host, Origin, Content-Type, the
  env keys) refuse with their own status. When only the console-key table can decide, a
  body that would be spooled waits: the socket is paused (what was already read stays in
  memory, at most one read) while access.guard.admit looks the key up in a thread; then
  the request is refused or the body is read as usual. A chunked body is counted as it
  arrives and cut at the limit. A refusal is written at once in the JSON error shape with
  `Connection: close`, and the connection is closed: nothing of the body is stored.
  The ASGI layers still run every check for the requests that pass (the per-key quota
  and a console key's scope are theirs).
- Every malformed request gets the JSON error shape: Twisted's bare
  `400 Bad Request` (bad request line, bad or too many headers, a bad Content-Length or
  chunked framing) and Daphne's HTML error pages (a non-ASCII path or query string, an
  application that fails) are replaced.
- Every status line carries its standard reason phrase (`setResponseCode`): Twisted's
  table lacks 422 and 429 and would write `422 Unknown Status`.
- Daphne's access log (NCSA lines with the query string: `?api_key=...`) and Twisted's
  (the combined log on `-v 2`) are turned off: pantheon_site.access_log writes ours,
  without query strings. The requests refused here are logged there too.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from http import HTTPStatus
from io import BytesIO
from urllib.parse import unquote

log = logging.getLogger("pantheon.http")

SPOOL_BYTES = 100_000  # Twisted's _getContentFile: a body this long goes to a temp file
LINGER_S = 5.0  # after a refusal, what the client still sends is read and dropped this long
_installed = False


def install() -> None:
    """Replace Daphne's request and factory classes (idempotent)."""
    global _installed
    if _installed:
        return
    from daphne import http_protocol, server

    http_protocol.WebRequest = _request_class()  # HTTPFactory.buildProtocol reads this name
    server.HTTPFactory = _factory_class()  # Server.run reads this name
    server.Server.log_action = _no_action_log
    _installed = True


def _no_action_log(self, protocol, action, details) -> None:
    """Daphne's action logger (its access log: path and query string) says nothing."""


# --- the raw answers -------------------------------------------------------------------


def raw_error(status: int, message: str, type_: str, headers=(), path: str = "") -> bytes:
    """A whole HTTP/1.1 response, closing the connection, in the error shape of the wire
    format `path` speaks (Anthropic's on /v1/messages, Ollama's on /api/, the contract's
    elsewhere: pantheon_platform.errors.wire_error_body), as the ASGI layers answer."""
    from pantheon_platform.errors import wire_error_body

    body = json.dumps(wire_error_body(path, status, message, type_), separators=(",", ":"))
    body = body.encode()
    lines = [
        b"HTTP/1.1 %d %s" % (status, reason_phrase(status)),
        b"content-type: application/json",
        b"content-length: " + str(len(body)).encode(),
        b"access-control-allow-origin: *",
        b"connection: close",
        *(name + b": " + value for name, value in headers),
    ]
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def reason_phrase(status: int) -> bytes:
    """The status line's standard reason phrase (Python's table: Twisted's RESPONSES has no
    422 or 429 and would send "Unknown Status")."""
    try:
        return HTTPStatus(status).phrase.encode("ascii")
    except ValueError:
        return b"Error"


def answer_and_close(channel, answer: bytes) -> None:
    """Write `answer`, parse nothing more, and close. The write side closes at once (the
    client reads the answer, then EOF); what the client still sends is read and dropped
    for up to LINGER_S, so that closing on unread data (a TCP reset) cannot destroy the
    answer before the client has read it."""
    if getattr(channel, "_pantheon_closing", False):
        return
    channel._pantheon_closing = True
    # Whatever is buffered or arrives later is never parsed as a request.
    channel.paused = True  # LineReceiver stops at the next line
    channel.dataReceived = channel.lineReceived = channel.rawDataReceived = _drop
    transport = channel.transport
    if transport is None:
        return
    transport.write(answer)
    try:
        transport.loseWriteConnection()
        channel._networkProducer.resumeProducing()  # keep reading (and dropping)
    except (AttributeError, NotImplementedError):
        transport.loseConnection()
        return
    from twisted.internet import reactor

    reactor.callLater(LINGER_S, _abort, transport)


def _drop(*args) -> None:
    return None


def _abort(transport) -> None:
    if getattr(transport, "connected", False):
        transport.abortConnection()


def _log_refusal(method: str, path: str, status: int, size: int, started: float, key=None):
    from pantheon_site.access_log import write

    scope = {"method": method, "path": path, "pantheon.key": key}
    state = {"status": status, "bytes": size, "ended": True}
    write(scope, {}, state, False, time.perf_counter() - started)


def _bad_request(channel, message: str | None = None) -> None:
    """HTTPChannel._respondToBadRequestAndDisconnect, in the JSON error shape."""
    if message is None and getattr(channel, "_receivedHeaderSize", 0) > getattr(
        channel, "totalHeadersSize", 1 << 62
    ):
        message = f"the request line and headers are over {channel.totalHeadersSize} bytes"
    elif message is None and getattr(channel, "_receivedHeaderCount", 0) > getattr(
        channel, "maxHeaders", 1 << 62
    ):
        message = f"the request has more than {channel.maxHeaders} headers"
    elif message is None:
        message = (
            "malformed HTTP request: the request line, a header, the Content-Length or "
            "the chunked body framing cannot be parsed"
        )
    answer = raw_error(400, message, "invalid_request_error")
    answer_and_close(channel, answer)
    _log_refusal("", "", 400, len(answer), time.perf_counter())


# --- Daphne's request and factory ----------------------------------------------------------


def _request_class():
    from daphne.http_protocol import WebRequest
    from twisted.web.http import _getContentFile

    class PantheonRequest(WebRequest):
        _refused = False
        _waiting = False  # the console-key lookup runs; the socket is paused
        _stashed = None  # requestReceived's arguments, while waiting
        _limit = None
        _received = 0
        _length = None

        # Twisted: the headers are in, no body byte has been stored yet.
        def gotLength(self, length):
            self._started = time.perf_counter()
            self._length = length
            try:
                scope = self._early_scope()
            except UnicodeDecodeError:
                return self._refuse(400, "invalid characters in path", "invalid_request_error")
            if scope is None:  # no request line (cannot happen after lineReceived)
                return super().gotLength(length)
            self._scope = scope
            from access import guard
            from pantheon_platform import routes

            self._limit = routes.body_limit(scope["path"])
            # In the ASGI layers' order: the guard's refusals, then the body limit.
            try:
                verdict = guard.check_now(scope)
            except guard.Refusal as refusal:
                return self._refuse(refusal.status, refusal.message, refusal.type, refusal.headers)
            except Exception:  # e.g. the settings cannot be read: the ASGI layers decide
                log.exception("early request check failed")
                verdict = None
            if verdict is not guard.NEEDS_DATABASE and self._over_limit(length):
                return self._refuse_too_large()
            if verdict is guard.NEEDS_DATABASE and (length is None or length >= SPOOL_BYTES):
                # Only the console-key table can decide, and the body would be spooled.
                self.content = BytesIO()  # at most one read, while the socket is paused
                self._waiting = True
                self.channel._networkProducer.pauseProducing()
                task = asyncio.get_event_loop().create_task(guard.admit(dict(scope)))
                task.add_done_callback(self._admitted)
                return None
            return super().gotLength(length)

        def _early_scope(self) -> dict | None:
            channel = self.channel
            command, target = getattr(channel, "_command", None), getattr(channel, "_path", None)
            if command is None or target is None:
                return None
            from pantheon_platform.routes import canonical

            raw_path = target.split(b"?", 1)[0]
            path = canonical(unquote(raw_path.decode("ascii")) or "/")
            headers = [
                (name.lower(), value)
                for name, values in self.requestHeaders.getAllRawHeaders()
                if b"_" not in name  # as Daphne (CVE-2015-0219)
                for value in values
            ]
            host = getattr(self, "host", None)
            server = [str(host.host), host.port] if hasattr(host, "port") else None
            return {
                "type": "http",
                "method": command.decode("ascii", "replace"),
                "path": path,
                "headers": headers,
                "server": server,
            }

        def _admitted(self, task) -> None:
            from access import guard

            self._waiting = False
            if self.channel is None or self._refused:
                return  # the client went away meanwhile
            try:
                task.result()
            except guard.Refusal as refusal:
                return self._refuse(refusal.status, refusal.message, refusal.type, refusal.headers)
            except Exception:
                log.exception("early key check failed")
                return self._refuse(500, "internal server error", "server_error")
            if self._over_limit(self._length):
                return self._refuse_too_large()
            held = self.content.getvalue()
            self.content = _getContentFile(self._length)
            self.content.write(held)
            self.channel._networkProducer.resumeProducing()
            if self._stashed is not None:
                args, self._stashed = self._stashed, None
                super().requestReceived(*args)

        def _over_limit(self, length) -> bool:
            return length is not None and self._limit is not None and length > self._limit

        def _refuse_too_large(self) -> None:
            from pantheon_site import limits

            message = limits.too_large(self._scope["path"], self._limit)
            self._refuse(413, message, "request_too_large")

        def handleContentChunk(self, data):
            if self._refused:
                return
            self._received += len(data)
            if self._over_limit(self._received):  # a chunked body, cut at the limit
                return self._refuse_too_large()
            self.content.write(data)

        def requestReceived(self, command, path, version):
            if self._refused:
                return
            if self._waiting:
                self._stashed = (command, path, version)
                return
            super().requestReceived(command, path, version)

        def _refuse(self, status, message, type_, headers=()) -> None:
            """Answer now, drop whatever of the body arrives, close the connection."""
            self._refused = True
            self.content = BytesIO()
            self.requestHeaders.removeHeader(b"expect")  # no 100 Continue after this
            scope = getattr(self, "_scope", None) or {}
            answer = raw_error(status, message, type_, headers, scope.get("path", ""))
            answer_and_close(self.channel, answer)
            _log_refusal(
                scope.get("method", ""),
                scope.get("path", ""),
                status,
                len(answer),
                getattr(self, "_started", time.perf_counter()),
                scope.get("pantheon.key"),
            )

        def setResponseCode(self, code, message=None):  # noqa: N802 (Twisted's name)
            """Every response's status line (Daphne passes no phrase) with its standard
            reason phrase: `422 Unprocessable Entity`, not `422 Unknown Status`."""
            super().setResponseCode(code, message or reason_phrase(code))

        # Daphne's HTML error page (a non-ASCII path or query, an application that fails)
        def basic_error(self, status, status_text, body):
            from pantheon_platform.errors import wire_error_body

            type_ = "invalid_request_error" if status < 500 else "server_error"
            path = (getattr(self, "path", None) or b"").split(b"?", 1)[0]
            payload = json.dumps(
                wire_error_body(path.decode("latin-1"), status, str(body), type_),
                separators=(",", ":"),
            )
            self.handle_reply(
                {
                    "type": "http.response.start",
                    "status": status,
                    "headers": [
                        (b"content-type", b"application/json"),
                        (b"access-control-allow-origin", b"*"),
                    ],
                }
            )
            self.handle_reply({"type": "http.response.body", "body": payload.encode()})

    return PantheonRequest


def _factory_class():
    from daphne.http_protocol import HTTPFactory

    class PantheonHTTPFactory(HTTPFactory):
        def buildProtocol(self, addr):
            protocol = super().buildProtocol(addr)
            channel = getattr(protocol, "_channel", None)
            if channel is not None:
                channel._respondToBadRequestAndDisconnect = lambda: _bad_request(channel)
                # A line past LineReceiver.MAX_LENGTH: Twisted closes without a word.
                channel.lineLengthExceeded = lambda line: _bad_request(
                    channel, f"a request line or header is over {channel.MAX_LENGTH} bytes"
                )
            return protocol

        def log(self, request) -> None:
            """Twisted's combined access log (with the query string, on `daphne -v 2`):
            pantheon_site.access_log writes ours."""

    return PantheonHTTPFactory
