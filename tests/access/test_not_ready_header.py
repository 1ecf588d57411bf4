"""An instance's "nothing ran here" refusals name their type in X-Pantheon-Error-Type on
every wire format, whatever its error body's shape: a router reads it to send the request
to another replica instead of passing the 503 on (cluster/dispatch.py NOT_READY)."""

from __future__ import annotations

import pytest

from pantheon_platform.errors import ERROR_TYPE_HEADER
from tests.access.asgi_raw import request, stack_app
from tests.wire.helpers import HELLO

pytestmark = [pytest.mark.anyio, pytest.mark.django_db(transaction=True)]

BODIES = {
    "/v1/chat/completions": {"messages": HELLO},
    "/v1/completions": {"prompt": "Hi"},
    "/v1/messages": {"model": "m", "max_tokens": 4, "messages": HELLO},
    "/v1/responses": {"input": "Hi"},
    "/api/chat": {"model": "m", "messages": HELLO},
    "/api/generate": {"model": "m", "prompt": "Hi"},
    "/completion": {"prompt": "Hi"},
}


@pytest.mark.parametrize("path", sorted(BODIES))
async def test_no_model_loaded_is_named_in_a_header(path, empty_runtime):
    reply = await request(stack_app(), "POST", path, BODIES[path])
    assert reply.status == 503, reply.body[:300]
    assert reply.headers[ERROR_TYPE_HEADER.lower()] == "no_models_loaded"


async def test_shutting_down_is_named_in_a_header(empty_runtime, monkeypatch):
    from pantheon_platform import shutdown

    monkeypatch.setattr(shutdown, "draining", lambda: True)
    reply = await request(
        stack_app(), "POST", "/v1/chat/completions", BODIES["/v1/chat/completions"]
    )
    assert reply.status == 503, reply.body[:300]
    assert reply.headers[ERROR_TYPE_HEADER.lower()] == "server_shutting_down"


async def test_every_refusal_names_its_type_in_a_header(empty_runtime):
    """Not only the 503s the router acts on: a 400 from a view and a 404 from the URL
    resolver carry it too, each in its route's own body shape."""
    bad = await request(stack_app(), "POST", "/v1/messages", {"model": "m"})
    assert bad.status == 400, bad.body[:300]
    assert bad.headers[ERROR_TYPE_HEADER.lower()] == "invalid_request_error"
    missing = await request(stack_app(), "GET", "/v1/no-such-route")
    assert missing.status == 404, missing.body[:300]
    assert missing.headers[ERROR_TYPE_HEADER.lower()] == "not_found"
