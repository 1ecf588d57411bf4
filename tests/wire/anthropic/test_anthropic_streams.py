"""/v1/messages beside /v1/chat/completions (one core: the same greedy text and calls),
and its stream's ends: a client hanging up stops the generation; a failure after the
stream opened is Anthropic's `event: error`, never a truncated stream that looks whole."""

from __future__ import annotations

import asyncio
import json

import pytest

from engine.types import GenerationFailed
from tests.wire.anthropic.test_anthropic_messages import ASK, WEATHER, sse
from tests.wire.helpers import CHAT, HELLO, AsgiCall
from tests.wire.openai_chat.test_chat_disconnect import LONG, answer_when_free, closed_streams  # noqa: F401

pytestmark = pytest.mark.anyio

MESSAGES = "/v1/messages"


async def post(client, path: str, payload: dict):
    return await client.post(path, data=json.dumps(payload), content_type="application/json")


async def test_the_same_greedy_text_and_call_as_chat_completions(client, served):
    chat = (
        await post(client, CHAT, {"messages": HELLO, "max_tokens": 24, "temperature": 0})
    ).json()
    message = (
        await post(client, MESSAGES, {"messages": HELLO, "max_tokens": 24, "temperature": 0})
    ).json()
    assert message["content"][0]["text"] == chat["choices"][0]["message"]["content"]
    assert message["usage"]["output_tokens"] == chat["usage"]["completion_tokens"]
    assert message["usage"]["input_tokens"] == chat["usage"]["prompt_tokens"]

    openai_tool = {
        "type": "function",
        "function": {
            "name": WEATHER["name"],
            "description": WEATHER["description"],
            "parameters": WEATHER["input_schema"],
        },
    }
    chat = (
        await post(
            client,
            CHAT,
            {
                "messages": ASK,
                "tools": [openai_tool],
                "tool_choice": "required",
                "max_tokens": 80,
                "temperature": 0,
            },
        )
    ).json()
    message = (
        await post(
            client,
            MESSAGES,
            {
                "messages": ASK,
                "tools": [WEATHER],
                "tool_choice": {"type": "any"},
                "max_tokens": 80,
                "temperature": 0,
            },
        )
    ).json()
    [call] = chat["choices"][0]["message"]["tool_calls"]
    [use] = [block for block in message["content"] if block["type"] == "tool_use"]
    assert use["name"] == call["function"]["name"]
    assert use["input"] == json.loads(call["function"]["arguments"])


def text_deltas(call: AsgiCall) -> int:
    return sum(b'"text_delta"' in chunk for chunk in call.chunks)


async def test_hanging_up_mid_stream_aborts_the_generation(
    asgi_app,
    served,
    closed_streams,  # noqa: F811
):
    payload = {"messages": LONG, "max_tokens": 400, "temperature": 0, "stream": True}
    streaming = AsgiCall(asgi_app, MESSAGES, json.dumps(payload).encode()).start()
    await streaming.wait_for(lambda c: text_deltas(c) >= 2, timeout=120)
    assert streaming.status == 200 and closed_streams == []
    streaming.hang_up.set()
    await asyncio.wait_for(streaming.task, 10)  # the handler returns; nothing hangs
    assert len(closed_streams) == 1
    assert b"message_stop" not in b"".join(streaming.chunks)
    after = await answer_when_free(asgi_app)  # the slot is free again within a step
    assert after.status == 200


async def test_a_failure_after_the_stream_opened_is_an_error_event(
    client, served, smollm2_service, monkeypatch
):
    real_generate = smollm2_service.generate

    async def fails_after_two_events(request):
        stream = real_generate(request)
        try:
            for _ in range(2):
                yield await anext(stream)
            raise GenerationFailed("the engine thread died (test)")
        finally:
            await stream.aclose()

    monkeypatch.setattr(smollm2_service, "generate", fails_after_two_events)
    payload = {"messages": HELLO, "max_tokens": 24, "temperature": 0, "stream": True}
    response = await post(client, MESSAGES, payload)
    assert response.status_code == 200
    events = sse(b"".join([chunk async for chunk in response.streaming_content]))
    names = [name for name, _ in events]
    assert names[:3] == ["message_start", "ping", "content_block_start"]
    assert names[-2:] == ["content_block_stop", "error"]  # the open block closed first
    assert "message_stop" not in names
    error = events[-1][1]
    assert error["error"]["type"] == "api_error" and "traceback" not in error["error"]["message"]
