"""Raw ASGI requests for the limit and access-log tests: a body in chunks, with or without
a declared Content-Length, through the whole stack (pantheon_site.stack)."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

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
        """The message, after checking the status and the error shape."""
        assert self.status == status, (self.status, self.body[:500])
        body = self.json()
        assert set(body) == {"error"}, body
        assert set(body["error"]) >= {"message", "type", "code"}, body
        assert body["error"]["type"] == type_, body
        assert "Traceback" not in body["error"]["message"]
        assert self.headers["access-control-allow-origin"] == "*"
        assert self.headers["content-type"] == "application/json"
        return body["error"]["message"]


async def request(
    app,
    method: str,
    path: str,
    body: bytes | dict | list | None = None,
    *,
    chunks: list[bytes] | None = None,
    content_length: int | str | None | bool = True,
    headers: dict[str, str] | None = None,
    query: str = "",
    timeout: float = 60,
) -> Raw:
    """One request. `body` (a dict/list is JSON-encoded) or `chunks` (sent as separate
    http.request messages); `content_length` True declares the real length, False none
    (chunked), a number or a string declares that."""
    if isinstance(body, dict | list):
        body = json.dumps(body).encode()
    if chunks is None:
        chunks = [body or b""]
    sent = [("host", HOST), ("content-type", "application/json")]
    if content_length is True:
        sent.append(("content-length", str(sum(map(len, chunks)))))
    elif content_length is not False and content_length is not None:
        sent.append(("content-length", str(content_length)))
    for name, value in (headers or {}).items():
        sent.append((name.lower(), value))
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": query.encode(),
        "root_path": "",
        "headers": [(k.encode(), v.encode()) for k, v in sent],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
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
