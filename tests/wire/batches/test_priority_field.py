"""The `priority` extension field of chat and text completions: "batch" runs a live
request in the engine's batch class (the same answer, greedy); anything but
"interactive" or "batch" is a 400 naming it."""

from __future__ import annotations

import pytest

from tests.access.helpers import call

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.anyio]

CHAT = {
    "messages": [{"role": "user", "content": "What is the capital of France?"}],
    "temperature": 0,
    "max_tokens": 5,
}


def blank(body: dict) -> dict:
    return {k: v for k, v in body.items() if k not in ("id", "created", "system_fingerprint")}


async def test_a_batch_priority_request_answers_as_an_interactive_one(app):
    live = await call(app, "POST", "/v1/chat/completions", body=CHAT, timeout=300)
    batch = await call(
        app, "POST", "/v1/chat/completions", body={**CHAT, "priority": "batch"}, timeout=300
    )
    assert live.status == batch.status == 200
    assert blank(batch.json()) == blank(live.json())
    text = await call(
        app,
        "POST",
        "/v1/completions",
        body={"prompt": "Paris is", "max_tokens": 3, "temperature": 0, "priority": "batch"},
        timeout=300,
    )
    assert text.status == 200, text.body


@pytest.mark.parametrize("value", ["urgent", 1, ["batch"]])
async def test_an_unknown_priority_is_a_400_naming_it(app, value):
    reply = await call(app, "POST", "/v1/chat/completions", body={**CHAT, "priority": value})
    assert "priority" in reply.error(400, "invalid_request_error")
