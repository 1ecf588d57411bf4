"""BodyLimit: the request body's size, bounded per route class before Django reads it.

A declared Content-Length over the route's limit (pantheon_site/routes.body_limit: 64 MiB
for chat, completions and restore, 4 MiB for every other route) is answered 413
`request_too_large` at once, without calling the application. A body without a declared
length (chunked) is counted as it arrives: the chunk that crosses the limit is never handed
on; the client gets the 413 and the application an `http.disconnect`, on which Django stops
reading (it answers nothing to a request whose client is gone). So Django never sees more
than a route's limit, and never a truncated body. A malformed or repeated Content-Length is
a 400.

Under Daphne the same limit is applied earlier, once the headers are in and before the
body is stored (pantheon_site/daphne_hooks.py: Twisted would spool it to a temporary
file first); this layer is the one other ASGI servers and the tests meet.
"""

from __future__ import annotations

import re

from pantheon_platform import routes
from pantheon_platform.errors import send_asgi_error as send_error

_LENGTH = re.compile(rb"[ \t]*([0-9]+)[ \t]*")
_MAX_DIGITS = 18  # more digits than this is past every limit (and int() need not see it)


class BodyLimit:
    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        path = scope.get("path", "")
        limit = routes.body_limit(path)
        lengths = [
            value for name, value in scope.get("headers", ()) if name.lower() == b"content-length"
        ]
        if lengths:
            match = _LENGTH.fullmatch(lengths[0]) if len(lengths) == 1 else None
            if match is None:
                return await send_error(
                    send, 400, "malformed Content-Length header", "invalid_request_error", path=path
                )
            digits = match[1].lstrip(b"0")
            if len(digits) > _MAX_DIGITS or int(digits or b"0") > limit:
                return await send_error(
                    send, 413, too_large(path, limit), "request_too_large", path=path
                )

        received = 0
        started = False  # the application's response has begun
        refused = False  # we answered 413: the application's own answer is dropped

        async def limited_receive():
            nonlocal received, refused
            if refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    # The chunk that crosses the limit is not handed on: the application
                    # sees a client that went away, never a truncated body.
                    if not started:
                        refused = True
                        await send_error(
                            send, 413, too_large(path, limit), "request_too_large", path=path
                        )
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message):
            nonlocal started
            if refused:
                return
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        await self.app(scope, limited_receive, guarded_send)


def too_large(path: str, limit: int) -> str:
    kind = routes.body_class(path)
    size = f"{limit // routes.MIB} MiB" if limit % routes.MIB == 0 else f"{limit} bytes"
    where = "chat, completion and restore routes" if kind == "large" else "management routes"
    if path == routes.RESTORE_PATH and limit > routes.LARGE_BODY_BYTES:
        where = "/session/restore (a full context window of the largest served model)"
    return f"request body is over {size}, the limit of {where}"
