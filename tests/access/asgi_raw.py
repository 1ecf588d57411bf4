"""Raw ASGI requests for the limit and access-log tests: a body in chunks, with or without
a declared Content-Length, through the whole stack (pantheon_site.stack)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

from tests.support import asgi_scope

HOST = "127.0.0.1:8000"


def stack_app():
    """Every layer of pantheon_site.stack around Django (not pantheon_site.asgi, which
    starts the model loader and installs signal handlers)."""
    from django.core.asgi import get_asgi_application

    from pantheon_site import stack

    try:
        from access import keys

        keys.forget_cache()
    except ImportError:
        pass
    return stack.build(get_asgi_application())


@dataclass
class Raw:
    status: int = 0
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""
    chunks_read: int = 0  # body chunks the application pulled from the client

    def json(self):
        return json.loads(self.body)

    def error(self, status: int, type_: str) -> str:
        """The message, after checking the status and the contract's error shape."""
        assert self.status == status, (self.status, self.body[:500])
        body = self.json()
        assert set(body) == {"error"}, body
        error = body["error"]
        assert set(error) >= {"message", "type", "code"}, body
        assert error["type"] == type_ and error["code"] is None and error["message"], body
        assert "Traceback" not in error["message"]
        assert self.headers["access-control-allow-origin"] == "*"
        assert self.headers["content-type"] == "application/json"
        return error["message"]


DEFAULT_SERVER = ("127.0.0.1", 8000)


async def request(
    app,
    method: str,
    path: str,
    body: bytes | dict | list | None = None,
    *,
    chunks: list[bytes] | None = None,
    content_length: int | str | None | bool = True,
    headers: dict[str, str | None] | None = None,
    query: str = "",
    server=DEFAULT_SERVER,
    timeout: float = 60,
) -> Raw:
    """One request as Daphne hands it over. `body` (a dict/list is JSON-encoded) or
    `chunks` (sent as separate http.request messages); `content_length` True declares the
    real length, False none (chunked), a number or a string declares that. Host is
    127.0.0.1:8000 and a body is declared application/json unless `headers` says
    otherwise (None drops one of those two); any other header is added, so a name may be
    sent twice."""
    if isinstance(body, dict | list):
        body = json.dumps(body).encode()
    defaults = {"host": HOST}
    if body is not None or chunks is not None:
        defaults["content-type"] = "application/json"
    added = []
    for name, value in (headers or {}).items():
        name = name.lower()
        if name in ("host", "content-type"):
            defaults.pop(name, None)
            if value is not None:
                defaults[name] = value
        elif value is not None:
            added.append((name, value))
    if chunks is None:
        chunks = [body or b""]
    sent = list(defaults.items())
    if content_length is True:
        sent.append(("content-length", str(sum(map(len, chunks)))))
    elif content_length is not False and content_length is not None:
        sent.append(("content-length", str(content_length)))
    sent += added
    scope = {
        **asgi_scope(method, path),
        "query_string": query.encode(),
        "headers": [(k.encode(), v.encode()) for k, v in sent],
        "server": server,
    }
    raw = Raw()
    parts: list[bytes] = []
    done = asyncio.Event()
    pending = list(chunks)

    async def receive():
        if pending:
            raw.chunks_read += 1
            chunk = pending.pop(0)
            return {"type": "http.request", "body": chunk, "more_body": bool(pending)}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.start":
            raw.status = message["status"]
            raw.headers = {k.decode().lower(): v.decode() for k, v in message["headers"]}
        elif message["type"] == "http.response.body":
            parts.append(message.get("body", b""))
            if not message.get("more_body"):
                done.set()

    await asyncio.wait_for(app(scope, receive, send), timeout)
    raw.body = b"".join(parts)
    return raw
