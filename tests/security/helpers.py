"""Helpers for the access tests (imported as tests.security.helpers): raw ASGI calls with
any Host, Origin or key, the refusal shape, console keys made as the console makes them."""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass, field

LOOPBACK = ("127.0.0.1", 8000)
HOST = "127.0.0.1:8000"
CLIENT_KEY = "client-secret-key"
ADMIN_KEY = "admin-secret-key"


@dataclass
class Reply:
    status: int
    headers: dict[str, str] = field(default_factory=dict)
    body: bytes = b""

    def json(self):
        return json.loads(self.body)

    def error(self, status: int, type_: str) -> str:
        """The message, after checking the status and the contract's error shape."""
        assert self.status == status, (self.status, self.body)
        error = self.json()["error"]
        assert set(self.json()) == {"error"}
        assert error["type"] == type_ and error["code"] is None and error["message"], error
        assert self.headers["access-control-allow-origin"] == "*"
        assert self.headers["content-type"] == "application/json"
        return error["message"]


async def call(
    app,
    method: str,
    path: str,
    *,
    body: bytes | dict | None = None,
    headers: dict[str, str] | None = None,
    server=LOOPBACK,
    timeout: float = 60,
) -> Reply:
    """One request through `app` as Daphne hands it over; `headers` replace the defaults
    (Host 127.0.0.1:8000, and Content-Type application/json for a dict body)."""
    if isinstance(body, dict):
        body = json.dumps(body).encode()
    sent = {"host": HOST}
    if body is not None:
        sent["content-type"] = "application/json"
    for name, value in (headers or {}).items():
        if value is None:
            sent.pop(name.lower(), None)
        else:
            sent[name.lower()] = value
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(k.encode(), v.encode()) for k, v in sent.items()],
        "client": ("127.0.0.1", 50000),
        "server": server,
    }
    reply = Reply(0)
    chunks = []
    delivered = False
    done = asyncio.Event()

    async def receive():
        nonlocal delivered
        if not delivered:
            delivered = True
            return {"type": "http.request", "body": body or b"", "more_body": False}
        await done.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.start":
            reply.status = message["status"]
            reply.headers = {k.decode().lower(): v.decode() for k, v in message["headers"]}
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                done.set()

    await asyncio.wait_for(app(scope, receive, send), timeout)
    reply.body = b"".join(chunks)
    return reply


def console_key(name: str, scopes: list[str], **fields) -> str:
    """A console key stored as the console stores it (hash and prefix); returns the key."""
    from access import keys
    from access.models import ApiKey

    key = keys.generate()
    ApiKey.objects.create(
        name=name,
        prefix=key[: keys.PREFIX_CHARS],
        key_hash=keys.digest(key),
        scopes=scopes,
        **fields,
    )
    return key


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


async def make_key(name: str, scopes: list[str], **fields) -> str:
    """console_key() from async code (database access runs in a thread)."""
    return await in_db(console_key, name, scopes, **fields)


async def in_db(fn, *args, **kwargs):
    """fn(*args) in a thread (the ORM refuses to run on the event loop): one of the test's
    own event loop, which ends with it. Not asgiref's shared sync thread: the test
    database is in-memory SQLite, whose connections Django never closes, and one left in
    that thread trips pytest-django's blocker in a later test without database access
    (Channels' consumers "close old connections" there)."""
    from asgiref.sync import sync_to_async

    return await sync_to_async(fn, thread_sensitive=False)(*args, **kwargs)
