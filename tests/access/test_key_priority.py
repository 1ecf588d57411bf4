"""A console key may run every request in the batch class (issue 34: priority per key):
the guard marks the request's scope, and the chat core's turn takes that class."""

from __future__ import annotations

import pytest

from access.guard import AccessGuard
from pantheon_platform import tenancy
from tests.access.helpers import console_key, in_db
from tests.support import asgi_scope

pytestmark = [pytest.mark.anyio, pytest.mark.django_db(transaction=True)]


async def through_guard(key: str) -> dict:
    """The scope the application behind the guard sees for a request with `key`."""
    seen: dict = {}

    async def app(scope, receive, send):
        seen.update(scope)
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    async def receive():
        return {"type": "http.request", "body": b"{}", "more_body": False}

    async def send(message):
        pass

    scope = asgi_scope("POST", "/v1/chat/completions")
    scope["headers"] = [*scope["headers"], (b"authorization", f"Bearer {key}".encode())]
    await AccessGuard(app)(scope, receive, send)
    return seen


async def test_a_batch_key_runs_every_request_in_the_batch_class():
    batch = await in_db(console_key, "nightly", ["inference"], priority="batch")
    live = await in_db(console_key, "typing", ["inference"])
    assert tenancy.priority(await through_guard(batch)) == tenancy.BATCH
    assert tenancy.priority(await through_guard(live)) == tenancy.INTERACTIVE
