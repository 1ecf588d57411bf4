"""Helpers for the access tests (imported as tests.access.helpers): raw ASGI calls with
any Host, Origin or key, the refusal shape, console keys made as the console makes them."""

from __future__ import annotations

from tests.access.asgi_raw import HOST as HOST  # re-exported for the access tests
from tests.access.asgi_raw import Raw, request

LOOPBACK = ("127.0.0.1", 8000)
CLIENT_KEY = "client-secret-key"
ADMIN_KEY = "admin-secret-key"


Reply = Raw  # the access tests' name for a raw reply


async def call(
    app,
    method: str,
    path: str,
    *,
    body: bytes | dict | None = None,
    headers: dict[str, str | None] | None = None,
    server=LOOPBACK,
    timeout: float = 60,
) -> Raw:
    """One request through `app` as Daphne hands it over (tests.access.asgi_raw);
    `headers` replace the defaults (Host 127.0.0.1:8000, and Content-Type
    application/json for a body; None drops one)."""
    return await request(app, method, path, body, headers=headers, server=server, timeout=timeout)


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
