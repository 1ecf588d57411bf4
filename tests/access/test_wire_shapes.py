"""Refusals made before any view (the access guard, the body limit) come in the error
shape of the wire format the route speaks: Anthropic's on /v1/messages, Ollama's on
/api/, the contract's elsewhere, so each SDK parses them as its own."""

from __future__ import annotations

import pytest

from pantheon_platform import routes
from tests.access.asgi_raw import request
from tests.access.helpers import bearer, call

pytestmark = [pytest.mark.anyio, pytest.mark.django_db(transaction=True)]


async def test_a_wrong_key_is_refused_in_each_routes_own_shape(app, rt, env_keys):
    anthropic = await call(app, "POST", "/v1/messages", body={}, headers=bearer("nope"))
    assert anthropic.status == 401
    assert anthropic.json()["type"] == "error"
    assert anthropic.json()["error"]["type"] == "authentication_error"
    assert anthropic.json()["error"]["message"]

    counted = await call(app, "POST", "/v1/messages/count_tokens", body={}, headers={})
    assert counted.status == 401 and counted.json()["error"]["type"] == "authentication_error"

    ollama = await call(app, "POST", "/api/chat", body={}, headers=bearer("nope"))
    assert ollama.status == 401
    assert set(ollama.json()) == {"error"} and isinstance(ollama.json()["error"], str)

    (await call(app, "POST", "/v1/chat/completions", body={}, headers=bearer("nope"))).error(
        401, "invalid_api_key"
    )


async def test_a_body_over_the_limit_is_refused_in_each_routes_own_shape(app, rt):
    limit = routes.body_limit("/v1/messages")
    anthropic = await request(app, "POST", "/v1/messages", b"", content_length=limit + 1)
    assert anthropic.status == 413 and anthropic.chunks_read == 0
    assert anthropic.json()["error"]["type"] == "request_too_large"
    ollama = await request(app, "POST", "/api/chat", b"", content_length=limit + 1)
    assert ollama.status == 413 and isinstance(ollama.json()["error"], str)
