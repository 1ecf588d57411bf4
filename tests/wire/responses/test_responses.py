"""POST /v1/responses, GET and DELETE /v1/responses/{id} in-process: through the whole
ASGI stack (the real access guard, so API keys and their namespaces are real) with the
real SmolLM2. Bad requests are 400s naming the field; a key never reaches another key's
stored responses; a follow-up through previous_response_id resumes from the cache."""

from __future__ import annotations

import asyncio
import json

import pytest

from tests.access.helpers import bearer, console_key, in_db
from tests.access.helpers import call as _call
from tests.conftest import SMOLLM2_NAME
from tests.wire.helpers import AsgiCall
from tests.wire.openai_chat.test_chat_disconnect import closed_streams  # noqa: F401  (fixture)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.anyio]

RESPONSES = "/v1/responses"
ASK = "What is the capital of France?"
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
    },
}


@pytest.fixture
def app(served):
    from django.core.asgi import get_asgi_application

    from access import keys
    from pantheon_site import stack

    keys.forget_cache()
    yield stack.build(get_asgi_application())
    keys.forget_cache()


async def call(app, method: str, path: str, **kwargs):
    """One request through the stack; generous time: the test machine may be busy."""
    return await _call(app, method, path, timeout=300, **kwargs)


def greedy(**fields) -> dict:
    return {"input": ASK, "temperature": 0, "max_output_tokens": 6, **fields}


def events_of(raw: bytes) -> list[dict]:
    """The SSE events: each `event: <type>` line matches its data's `type`."""
    events = []
    for block in raw.decode().split("\n\n"):
        if not block.strip():
            continue
        head, data = block.split("\n", 1)
        assert head.startswith("event: ") and data.startswith("data: "), block
        event = json.loads(data[len("data: ") :])
        assert event["type"] == head[len("event: ") :]
        events.append(event)
    return events


def without_ids(body: dict) -> dict:
    """A response with its per-call ids and times blanked (two runs compare equal)."""
    body = json.loads(json.dumps(body))
    body["id"] = body["created_at"] = None
    body.pop("completed_at", None)
    if body.get("usage"):
        body["usage"]["input_tokens_details"]["cached_tokens"] = None
    for item in body["output"]:
        item["id"] = None
    return body


# --- validation: 400 naming the field, never a 500 ------------------------------------

BAD = [
    ({}, "input"),
    ({"input": 3}, "input"),
    ({"input": []}, "input"),
    ({"input": [3]}, "input[0]"),
    ({"input": [{"role": "robot", "content": "hi"}]}, "input[0].role"),
    ({"input": [{"role": "user", "content": 5}]}, "input[0].content"),
    (
        {
            "input": [
                {
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "what is this?"},
                        {"type": "input_image", "image_url": "https://example.com/a.png"},
                    ],
                }
            ]
        },
        "input[0].content[1]",
    ),
    (
        {"input": [{"role": "user", "content": [{"type": "input_file", "file_id": "f"}]}]},
        "input[0].content[0]",
    ),
    ({"input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}, "input[0].call_id"),
    ({"input": [{"type": "function_call_output", "output": "x"}]}, "input[0].call_id"),
    ({"input": [{"type": "item_reference", "id": "msg_1"}]}, "input[0].type"),
    ({"input": [{"type": "computer_call_output", "call_id": "c"}]}, "input[0].type"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": "hi", "tools": [{"type": "file_search", "vector_store_ids": []}]}, "tools[0].type"),
    ({"input": "hi", "tools": [{"type": "function"}]}, "tools[0].name"),
    ({"input": "hi", "tool_choice": "required"}, "tool_choice"),
    ({"input": "hi", "tool_choice": "sometimes"}, "tool_choice"),
    (
        {"input": "hi", "tools": [WEATHER_TOOL], "tool_choice": {"type": "function"}},
        "tool_choice.name",
    ),
    (
        {"input": "hi", "tools": [WEATHER_TOOL], "tool_choice": {"type": "file_search"}},
        "tool_choice.type",
    ),
    ({"input": "hi", "text": {"format": {"type": "xml"}}}, "text.format.type"),
    (
        {"input": "hi", "text": {"format": {"type": "json_schema", "name": "x"}}},
        "text.format.schema",
    ),
    (
        {"input": "hi", "text": {"format": {"type": "json_schema", "schema": {}}}},
        "text.format.name",
    ),
    ({"input": "hi", "reasoning": {"effort": "extreme"}}, "reasoning.effort"),
    ({"input": "hi", "temperature": 3}, "temperature"),
    ({"input": "hi", "temperature": "hot"}, "temperature"),
    ({"input": "hi", "top_p": 1.5}, "top_p"),
    ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens"),
    ({"input": "hi", "max_output_tokens": 2**70}, "max_output_tokens"),
    ({"input": "hi", "store": "yes"}, "store"),
    ({"input": "hi", "stream": 1}, "stream"),
    ({"input": "hi", "metadata": {"k": 1}}, "metadata.k"),
    ({"input": "hi", "metadata": {f"k{i}": "v" for i in range(17)}}, "metadata"),
    ({"input": "hi", "instructions": ["be brief"]}, "instructions"),
    ({"input": "hi", "background": True}, "background"),
    ({"input": "hi", "conversation": "conv_1"}, "conversation"),
    ({"input": "hi", "previous_response_id": 7}, "previous_response_id"),
]


@pytest.mark.parametrize(("body", "param"), BAD)
async def test_a_bad_request_is_a_400_naming_the_field(app, body, param):
    reply = await call(app, "POST", RESPONSES, body=body)
    message = reply.error(400, "invalid_request_error")
    assert reply.json()["error"]["param"] == param, reply.json()
    assert param.split("[")[0].split(".")[0] in message


async def test_a_body_that_is_not_a_json_object_is_a_400(app):
    for raw in (b"", b"[1]", b"{", b'{"input": NaN}'):
        reply = await call(app, "POST", RESPONSES, body=raw)
        reply.error(400, "invalid_request_error")


async def test_an_image_part_is_refused_naming_it(app):
    body = {"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "x"}]}]}
    reply = await call(app, "POST", RESPONSES, body=body)
    assert "input_image" in reply.error(400, "invalid_request_error")


async def test_unknown_ids_are_404_and_other_methods_405(app):
    reply = await call(app, "GET", RESPONSES + "/resp_nope")
    assert "resp_nope" in reply.error(404, "invalid_request_error")
    (await call(app, "DELETE", RESPONSES + "/resp_nope")).error(404, "invalid_request_error")
    never = "resp_" + "0" * 48  # shaped like ours: looked up, and not there
    (await call(app, "GET", f"{RESPONSES}/{never}")).error(404, "invalid_request_error")
    (await call(app, "DELETE", f"{RESPONSES}/{never}")).error(404, "invalid_request_error")
    reply = await call(app, "POST", RESPONSES, body=greedy(previous_response_id="resp_nope"))
    reply.error(404, "invalid_request_error")
    assert reply.json()["error"]["param"] == "previous_response_id"
    reply = await call(app, "GET", RESPONSES)
    reply.error(405, "method_not_allowed")
    assert reply.headers["allow"] == "POST, OPTIONS"
    reply = await call(app, "PUT", RESPONSES + "/resp_nope", body={})
    reply.error(405, "method_not_allowed")


# --- answers --------------------------------------------------------------------------


async def test_a_response_is_stored_retrieved_and_deleted(app):
    reply = await call(app, "POST", RESPONSES, body=greedy(metadata={"run": "1"}))
    assert reply.status == 200, reply.body
    body = reply.json()
    assert body["id"].startswith("resp_") and body["object"] == "response"
    assert body["model"] == SMOLLM2_NAME and body["metadata"] == {"run": "1"}
    assert body["status"] == "incomplete"  # 6 tokens are not enough to finish
    assert body["incomplete_details"] == {"reason": "max_output_tokens"}
    [message] = body["output"]
    assert message["type"] == "message" and message["role"] == "assistant"
    assert message["status"] == "incomplete" and message["id"].startswith("msg_")
    [part] = message["content"]
    assert part["type"] == "output_text" and part["text"] and part["annotations"] == []
    usage = body["usage"]
    assert usage["output_tokens"] == 6 and usage["input_tokens"] > 0
    assert usage["total_tokens"] == usage["input_tokens"] + 6
    assert usage["input_tokens_details"]["cached_tokens"] == 0
    assert usage["output_tokens_details"]["reasoning_tokens"] == 0

    got = await call(app, "GET", f"{RESPONSES}/{body['id']}")
    assert got.status == 200 and got.json() == body
    gone = await call(app, "DELETE", f"{RESPONSES}/{body['id']}")
    assert gone.json() == {"id": body["id"], "object": "response.deleted", "deleted": True}
    (await call(app, "GET", f"{RESPONSES}/{body['id']}")).error(404, "invalid_request_error")


async def test_store_false_is_not_retrievable(app):
    reply = await call(app, "POST", RESPONSES, body=greedy(store=False))
    assert reply.status == 200 and reply.json()["store"] is False
    got = await call(app, "GET", f"{RESPONSES}/{reply.json()['id']}")
    got.error(404, "invalid_request_error")


async def test_the_stream_joins_to_the_non_streamed_body(app):
    plain = (await call(app, "POST", RESPONSES, body=greedy())).json()
    reply = await call(app, "POST", RESPONSES, body=greedy(stream=True))
    assert reply.status == 200 and reply.headers["content-type"] == "text/event-stream"
    events = events_of(reply.body)
    assert [e["sequence_number"] for e in events] == list(range(len(events)))
    types = [e["type"] for e in events]
    assert types[:4] == [
        "response.created",
        "response.in_progress",
        "response.output_item.added",
        "response.content_part.added",
    ]
    assert types[-4:] == [
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
        "response.incomplete",
    ]
    final = events[-1]["response"]
    text = "".join(e["delta"] for e in events if e["type"] == "response.output_text.delta")
    assert text == final["output"][0]["content"][0]["text"]
    assert without_ids(final) == without_ids(plain)
    # The same prompt again, under the key's implicit session: served from the cache.
    assert final["usage"]["input_tokens_details"]["cached_tokens"] > 0
    # Streamed and stored: the stored body is the final event's.
    got = await call(app, "GET", f"{RESPONSES}/{final['id']}")
    assert got.json() == final


async def test_a_follow_up_resumes_from_the_previous_turn(app):
    first = (await call(app, "POST", RESPONSES, body=greedy(instructions="Be brief."))).json()
    follow = await call(
        app,
        "POST",
        RESPONSES,
        body={
            "input": "And of Germany?",
            "instructions": "Be brief.",
            "previous_response_id": first["id"],
            "temperature": 0,
            "max_output_tokens": 8,
        },
    )
    assert follow.status == 200, follow.body
    body = follow.json()
    assert body["previous_response_id"] == first["id"]
    cached = body["usage"]["input_tokens_details"]["cached_tokens"]
    assert cached > first["usage"]["input_tokens"]  # the prompt and the answer
    assert body["usage"]["input_tokens"] > first["usage"]["total_tokens"]


async def test_a_follow_up_is_the_previous_conversation_without_its_instructions(app):
    first = (
        await call(app, "POST", RESPONSES, body=greedy(instructions="Answer in French."))
    ).json()
    answer = first["output"][0]["content"][0]["text"]
    again = await call(
        app, "POST", RESPONSES, body=greedy(input="Thanks", previous_response_id=first["id"])
    )
    again = again.json()
    assert again["instructions"] is None
    # The same conversation sent whole, with no system message: the same prompt.
    history = [
        {"role": "user", "content": ASK},
        {
            "type": "message",
            "role": "assistant",
            "content": [{"type": "output_text", "text": answer}],
        },
        {"role": "user", "content": [{"type": "input_text", "text": "Thanks"}]},
    ]
    whole = (await call(app, "POST", RESPONSES, body=greedy(input=history, store=False))).json()
    assert again["usage"]["input_tokens"] == whole["usage"]["input_tokens"]
    assert again["output"][0]["content"] == whole["output"][0]["content"]


async def test_a_required_tool_is_called_and_the_output_continues(app):
    tools = {"tools": [WEATHER_TOOL], "tool_choice": "required"}
    reply = await call(
        app,
        "POST",
        RESPONSES,
        body={
            "input": "What's the weather in Oslo?",
            "temperature": 0,
            "max_output_tokens": 80,
            **tools,
        },
    )
    body = reply.json()
    assert reply.status == 200 and body["status"] == "completed", body
    calls = [i for i in body["output"] if i["type"] == "function_call"]
    assert len(calls) == 1 and calls[0]["name"] == "get_weather"
    assert calls[0]["status"] == "completed" and "city" in json.loads(calls[0]["arguments"])
    assert body["tools"][0]["name"] == "get_weather" and body["tool_choice"] == "required"
    follow = await call(
        app,
        "POST",
        RESPONSES,
        body={
            "previous_response_id": body["id"],
            "input": [
                {
                    "type": "function_call_output",
                    "call_id": calls[0]["call_id"],
                    "output": '{"temperature_c": 21}',
                }
            ],
            "tools": [WEATHER_TOOL],
            "temperature": 0,
            "max_output_tokens": 24,
        },
    )
    assert follow.status == 200, follow.body
    assert follow.json()["usage"]["input_tokens_details"]["cached_tokens"] > 0


async def test_a_named_tool_choice_and_a_json_schema_format(app):
    reply = await call(
        app,
        "POST",
        RESPONSES,
        body={
            "input": "Weather in Paris?",
            "tools": [WEATHER_TOOL],
            "tool_choice": {"type": "function", "name": "get_weather"},
            "temperature": 0,
            "max_output_tokens": 80,
        },
    )
    body = reply.json()
    assert reply.status == 200, body
    assert body["tool_choice"] == {"type": "function", "name": "get_weather"}
    assert [i["name"] for i in body["output"] if i["type"] == "function_call"] == ["get_weather"]
    schema = {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    }
    fmt = {"type": "json_schema", "name": "place", "schema": schema, "strict": True}
    reply = await call(
        app,
        "POST",
        RESPONSES,
        body={"input": ASK, "text": {"format": fmt}, "temperature": 0, "max_output_tokens": 60},
    )
    body = reply.json()
    assert reply.status == 200 and body["status"] == "completed", body
    assert body["text"]["format"]["name"] == "place"
    assert set(json.loads(body["output"][0]["content"][0]["text"])) == {"city"}


async def test_hanging_up_mid_stream_aborts_the_generation_and_stores_nothing(
    asgi_app,
    served,
    closed_streams,  # noqa: F811
):
    body = {
        "input": "Count from 1 to 1000, separated by commas.",
        "temperature": 0,
        "max_output_tokens": 400,
        "stream": True,
    }
    streaming = AsgiCall(asgi_app, RESPONSES, json.dumps(body).encode()).start()
    deltas = lambda c: sum(b"response.output_text.delta" in chunk for chunk in c.chunks)  # noqa: E731
    await streaming.wait_for(lambda c: deltas(c) >= 2, timeout=120)
    assert streaming.status == 200 and closed_streams == []
    created = json.loads(streaming.chunks[0].split(b"data: ", 1)[1])
    streaming.hang_up.set()
    await asyncio.wait_for(streaming.task, 10)  # the handler returns; nothing hangs
    assert len(closed_streams) == 1  # the engine stream was closed: the generation stopped
    assert not any(b"response.completed" in chunk for chunk in streaming.chunks)
    rid = created["response"]["id"]
    got = AsgiCall(asgi_app, f"{RESPONSES}/{rid}", b"", method="GET").start()
    await asyncio.wait_for(got.task, 30)
    assert got.status == 404  # never finished: never stored


# --- reasoning (a think-style template) ----------------------------------------------


async def test_reasoning_effort_turns_thinking_on_and_off(app, thinker):
    body = {"model": "thinker", "input": ASK, "temperature": 0, "max_output_tokens": 24}
    thought = await call(app, "POST", RESPONSES, body={**body, "reasoning": {"effort": "low"}})
    thought = thought.json()
    assert thought["reasoning"] == {"effort": "low", "summary": None}
    item = thought["output"][0]
    assert item["type"] == "reasoning" and item["id"].startswith("rs_")
    assert item["summary"] == [] and item["content"][0]["type"] == "reasoning_text"
    assert item["content"][0]["text"] and "<think>" not in item["content"][0]["text"]
    assert thought["usage"]["output_tokens_details"]["reasoning_tokens"] > 0
    plain = await call(app, "POST", RESPONSES, body={**body, "reasoning": {"effort": "none"}})
    plain = plain.json()
    assert [i["type"] for i in plain["output"]] == ["message"]
    assert plain["usage"]["output_tokens_details"]["reasoning_tokens"] == 0


async def test_streamed_reasoning_joins_to_the_non_streamed_body(app, thinker):
    body = greedy(model="thinker", reasoning={"effort": "low"}, max_output_tokens=16)
    plain = (await call(app, "POST", RESPONSES, body=body)).json()
    events = events_of((await call(app, "POST", RESPONSES, body={**body, "stream": True})).body)
    thought = "".join(e["delta"] for e in events if e["type"] == "response.reasoning_text.delta")
    assert thought and thought == plain["output"][0]["content"][0]["text"]
    assert without_ids(events[-1]["response"]) == without_ids(plain)


# --- API keys: a key never reaches another key's responses -------------------------------


async def test_a_key_cannot_read_delete_or_continue_another_keys_response(app, settings):
    a = await in_db(console_key, "tenant-a", ["inference"])
    b = await in_db(console_key, "tenant-b", ["inference"])
    reply = await call(app, "POST", RESPONSES, body=greedy(), headers=bearer(a))
    assert reply.status == 200, reply.body
    rid = reply.json()["id"]
    (await call(app, "GET", f"{RESPONSES}/{rid}", headers=bearer(b))).error(
        404, "invalid_request_error"
    )
    (await call(app, "DELETE", f"{RESPONSES}/{rid}", headers=bearer(b))).error(
        404, "invalid_request_error"
    )
    follow = await call(
        app, "POST", RESPONSES, body=greedy(previous_response_id=rid), headers=bearer(b)
    )
    follow.error(404, "invalid_request_error")
    (await call(app, "GET", f"{RESPONSES}/{rid}")).error(401, "invalid_api_key")
    # The same prompt under B's key: nothing of A's cache (both run under their key's
    # implicit session id, each in its own namespace).
    other = await call(app, "POST", RESPONSES, body=greedy(), headers=bearer(b))
    assert other.json()["usage"]["input_tokens_details"]["cached_tokens"] == 0
    again = await call(app, "POST", RESPONSES, body=greedy(), headers=bearer(a))
    assert again.json()["usage"]["input_tokens_details"]["cached_tokens"] > 0
    got = await call(app, "GET", f"{RESPONSES}/{rid}", headers=bearer(a))
    assert got.status == 200 and got.json()["id"] == rid
