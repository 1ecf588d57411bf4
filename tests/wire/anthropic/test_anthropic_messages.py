"""POST /v1/messages and /v1/messages/count_tokens on the real SmolLM2 (in process): the
Anthropic body and event sequence, stop reasons, tools, thinking, sessions, and every bad
request answered in Anthropic's error shape with a 4xx."""

from __future__ import annotations

import json

import jsonschema
import pytest

from engine.decoding.stop_strings import StopStringBuffer
from tests.wire.helpers import HELLO

pytestmark = pytest.mark.anyio

MESSAGES = "/v1/messages"
COUNT = "/v1/messages/count_tokens"
WEATHER = {
    "name": "get_weather",
    "description": "Current weather for a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["c", "f"]}},
        "required": ["city", "unit"],
    },
}
ASK = [{"role": "user", "content": "What's the weather in Paris? Use a tool."}]


@pytest.fixture
def post(client):
    async def post(body, path=MESSAGES, **headers):
        data = body if isinstance(body, bytes | str) else json.dumps(body)
        return await client.post(path, data=data, content_type="application/json", headers=headers)

    return post


def body(**extra) -> dict:
    return {"messages": HELLO, "max_tokens": 24, "temperature": 0, **extra}


def sse(raw: bytes) -> list[tuple[str, dict]]:
    """(event name, data) of each event; the name must be the data's own type."""
    out = []
    for block in raw.decode().split("\n\n"):
        if not block.strip():
            continue
        name_line, data_line = block.split("\n")
        assert name_line.startswith("event: ") and data_line.startswith("data: "), block
        name, data = name_line[len("event: ") :], json.loads(data_line[len("data: ") :])
        assert data["type"] == name
        out.append((name, data))
    return out


async def stream_of(response) -> list[tuple[str, dict]]:
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/event-stream")
    return sse(b"".join([chunk async for chunk in response.streaming_content]))


def joined(events: list[tuple[str, dict]]) -> dict:
    """A stream's events joined into the message they describe (as the SDK joins them),
    checking the sequence on the way: start, blocks (start, deltas, stop), delta, stop."""
    names = [name for name, _ in events]
    assert names[:2] == ["message_start", "ping"]
    assert names[-2:] == ["message_delta", "message_stop"]
    message = events[0][1]["message"]
    assert message["content"] == [] and message["stop_reason"] is None
    content, partial, open_index = [], {}, None
    for name, data in events[2:-2]:
        if name == "content_block_start":
            assert open_index is None and data["index"] == len(content)
            open_index = data["index"]
            content.append(dict(data["content_block"]))
        elif name == "content_block_delta":
            assert data["index"] == open_index
            block, delta = content[open_index], data["delta"]
            kind = delta["type"]
            if kind == "text_delta":
                block["text"] += delta["text"]
            elif kind == "thinking_delta":
                block["thinking"] += delta["thinking"]
            else:
                assert kind == "input_json_delta"
                partial[open_index] = partial.get(open_index, "") + delta["partial_json"]
        else:
            assert name == "content_block_stop" and data["index"] == open_index
            open_index = None
    assert open_index is None
    for index, text in partial.items():
        content[index]["input"] = json.loads(text)
    delta = events[-2][1]
    return {
        **message,
        "content": content,
        "stop_reason": delta["delta"]["stop_reason"],
        "stop_sequence": delta["delta"]["stop_sequence"],
        "usage": {**message["usage"], **delta["usage"]},
    }


def assert_anthropic_error(response, status: int, kind: str, *words: str) -> str:
    assert response.status_code == status, response.content
    payload = response.json()
    assert payload["type"] == "error" and set(payload) == {"type", "error"}
    assert payload["error"]["type"] == kind
    message = payload["error"]["message"]
    for word in words:
        assert word in message, message
    return message


# --- plain and streamed ----------------------------------------------------------------


async def test_a_message_has_anthropics_shape(post, served):
    response = await post(body())
    assert response.status_code == 200, response.content
    reply = response.json()
    assert reply["id"].startswith("msg_") and reply["type"] == "message"
    assert reply["role"] == "assistant" and reply["model"] == "smollm2-135m-instruct"
    [block] = reply["content"]
    assert block["type"] == "text" and "Paris" in block["text"]
    assert reply["stop_reason"] in ("end_turn", "max_tokens")
    assert reply["stop_sequence"] is None
    usage = reply["usage"]
    assert usage["input_tokens"] > 0 and 0 < usage["output_tokens"] <= 24
    assert usage["cache_read_input_tokens"] == 0 and usage["cache_creation_input_tokens"] == 0


async def test_the_stream_joins_to_the_non_streamed_message(post, served):
    plain = (await post(body(system="Answer in one sentence."))).json()
    events = await stream_of(await post(body(system="Answer in one sentence.", stream=True)))
    streamed = joined(events)
    assert streamed["content"] == plain["content"]
    assert streamed["stop_reason"] == plain["stop_reason"]
    assert streamed["usage"] == plain["usage"]
    assert events[0][1]["message"]["usage"]["input_tokens"] == plain["usage"]["input_tokens"]


async def test_max_tokens_is_required_and_reported_as_the_stop_reason(post, served):
    missing = await post({"messages": HELLO})
    assert_anthropic_error(missing, 400, "invalid_request_error", "max_tokens")
    reply = (await post(body(max_tokens=3))).json()
    assert reply["stop_reason"] == "max_tokens" and reply["usage"]["output_tokens"] == 3


async def test_a_stop_sequence_is_named_streamed_and_not(post, served):
    text = (await post(body())).json()["content"][0]["text"]
    word = "Paris"
    assert word in text
    reply = (await post(body(stop_sequences=["zzz-never", word]))).json()
    assert reply["stop_reason"] == "stop_sequence" and reply["stop_sequence"] == word
    assert reply["content"][0]["text"] == text[: text.index(word)]
    streamed = joined(await stream_of(await post(body(stop_sequences=[word], stream=True))))
    assert streamed["stop_reason"] == "stop_sequence" and streamed["stop_sequence"] == word
    assert streamed["content"] == reply["content"]


def test_the_stop_buffer_remembers_the_earliest_match():
    buffer = StopStringBuffer(("world", "lo w"))
    assert buffer.push("hel") == "he"  # "l" may start "lo w"
    assert buffer.push("lo world") == "l"
    assert buffer.stopped and buffer.matched == "lo w"


# --- count_tokens and sessions ---------------------------------------------------------


async def test_count_tokens_is_the_prompt_a_message_would_have(post, served):
    for extra in ({}, {"system": "Be brief."}, {"tools": [WEATHER]}):
        counted = await post({"messages": HELLO, **extra}, path=COUNT)
        assert counted.status_code == 200, counted.content
        assert set(counted.json()) == {"input_tokens"}
        reply = (await post(body(max_tokens=1, **extra))).json()
        assert counted.json()["input_tokens"] == reply["usage"]["input_tokens"]
    tools = (await post({"messages": HELLO, "tools": [WEATHER]}, path=COUNT)).json()
    plain = (await post({"messages": HELLO}, path=COUNT)).json()
    assert tools["input_tokens"] > plain["input_tokens"]  # the tools are in the prompt


async def test_a_session_reads_its_cache_on_the_next_turn(post, served):
    first = (await post(body(), **{"X-Session-Id": "anthropic-cache"})).json()
    history = [
        *HELLO,
        {"role": "assistant", "content": first["content"]},
        {"role": "user", "content": "And of Italy?"},
    ]
    second = (
        await post({"messages": history, "max_tokens": 8, "session_id": "anthropic-cache"})
    ).json()
    usage = second["usage"]
    assert usage["cache_read_input_tokens"] >= first["usage"]["input_tokens"]
    assert usage["input_tokens"] > 0  # the new user turn was read


# --- tools -----------------------------------------------------------------------------


async def test_tool_choice_any_gives_a_valid_tool_use_streamed_and_not(post, served):
    request = {"messages": ASK, "tools": [WEATHER], "max_tokens": 80, "temperature": 0}
    reply = (await post({**request, "tool_choice": {"type": "any"}})).json()
    assert reply["stop_reason"] == "tool_use"
    [call] = [b for b in reply["content"] if b["type"] == "tool_use"]
    assert call["name"] == "get_weather" and call["id"]
    jsonschema.validate(call["input"], WEATHER["input_schema"])
    streamed = joined(
        await stream_of(await post({**request, "tool_choice": {"type": "any"}, "stream": True}))
    )
    [s_call] = [b for b in streamed["content"] if b["type"] == "tool_use"]
    assert {**s_call, "id": ""} == {**call, "id": ""}  # ids are made per request
    assert streamed["stop_reason"] == "tool_use"
    named = (await post({**request, "tool_choice": {"type": "tool", "name": "get_weather"}})).json()
    assert named["stop_reason"] == "tool_use"


async def test_a_tool_result_round_trip(post, served):
    request = {"messages": ASK, "tools": [WEATHER], "max_tokens": 80, "temperature": 0}
    first = (await post({**request, "tool_choice": {"type": "any"}})).json()
    call = next(b for b in first["content"] if b["type"] == "tool_use")
    history = [
        *ASK,
        {"role": "assistant", "content": first["content"]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": call["id"], "content": "31 C, sunny"}
            ],
        },
    ]
    final = await post({**request, "messages": history, "tool_choice": {"type": "none"}})
    assert final.status_code == 200, final.content
    reply = final.json()
    assert reply["stop_reason"] in ("end_turn", "max_tokens")
    assert [b["type"] for b in reply["content"]] == ["text"]
    # The result is in the prompt: a longer one counts more.
    counted = {k: v for k, v in request.items() if k not in ("max_tokens", "temperature")}
    counted["tool_choice"] = {"type": "none"}
    same = (await post({**counted, "messages": history}, path=COUNT)).json()
    assert same["input_tokens"] == reply["usage"]["input_tokens"]
    history[-1]["content"][0]["content"] = "31 C, sunny, a light wind from the west"
    longer = (await post({**counted, "messages": history}, path=COUNT)).json()
    assert longer["input_tokens"] > same["input_tokens"]


async def test_output_config_format_holds_the_answer_to_the_schema(post, served):
    schema = {
        "type": "object",
        "properties": {"capital": {"type": "string", "maxLength": 20}},
        "required": ["capital"],
        "additionalProperties": False,
    }
    for spelling in (
        {"output_config": {"format": {"type": "json_schema", "schema": schema}}},
        {"output_format": {"type": "json_schema", "schema": schema}},  # the older one
    ):
        reply = (await post(body(max_tokens=40, **spelling))).json()
        [block] = reply["content"]
        jsonschema.validate(json.loads(block["text"]), schema)


# --- thinking --------------------------------------------------------------------------


async def test_thinking_with_a_budget_comes_first_then_the_answer(post, thinker):
    request = {
        "model": "thinker",
        "messages": HELLO,
        "max_tokens": 40,
        "temperature": 0,
        "thinking": {"type": "enabled", "budget_tokens": 6},
    }
    reply = (await post(request)).json()
    kinds = [b["type"] for b in reply["content"]]
    assert kinds[0] == "thinking" and "text" in kinds
    assert reply["content"][0]["thinking"] and reply["content"][0]["signature"] == ""
    streamed = joined(await stream_of(await post({**request, "stream": True})))
    assert streamed["content"] == reply["content"]
    off = (await post({**request, "thinking": {"type": "disabled"}})).json()
    assert [b["type"] for b in off["content"]] == ["text"]


async def test_a_thinking_block_in_the_history_is_accepted(post, thinker):
    history = [
        *HELLO,
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "The capital.", "signature": ""},
                {"type": "redacted_thinking", "data": "opaque"},
                {"type": "text", "text": "Paris."},
            ],
        },
        {"role": "user", "content": [{"type": "text", "text": "And of Italy?"}]},
    ]
    response = await post({"model": "thinker", "messages": history, "max_tokens": 4})
    assert response.status_code == 200, response.content


# --- errors ------------------------------------------------------------------------------

BAD_BODIES = [
    ({"messages": HELLO, "max_tokens": 0}, "max_tokens"),
    ({"messages": HELLO, "max_tokens": "10"}, "max_tokens"),
    ({"max_tokens": 10}, "messages"),
    ({"messages": [], "max_tokens": 10}, "messages"),
    ({"messages": "hi", "max_tokens": 10}, "messages"),
    ({"messages": [{"role": "system", "content": "x"}], "max_tokens": 10}, "system"),
    ({"messages": [{"role": "bot", "content": "x"}], "max_tokens": 10}, "messages.0.role"),
    ({"messages": [{"role": "user", "content": 3}], "max_tokens": 10}, "messages.0.content"),
    (
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "what is this?"},
                        {"type": "image", "source": {"type": "url", "url": "http://x/a.png"}},
                    ],
                }
            ],
            "max_tokens": 10,
        },
        "messages.0.content.1: image blocks are not supported",
    ),
    (
        {
            "messages": [
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "content": [{"type": "image", "source": {}}],
                        }
                    ],
                }
            ],
            "max_tokens": 10,
        },
        "messages.0.content.0.content.0: image blocks",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "document"}]}], "max_tokens": 10},
        "document blocks are not supported",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "audio"}]}], "max_tokens": 10},
        '"audio"',
    ),
    (
        {
            "messages": [
                {"role": "user", "content": [{"type": "tool_use", "id": "t", "name": "f"}]}
            ],
            "max_tokens": 10,
        },
        "tool_use",
    ),
    (
        {
            "messages": [
                *HELLO,
                {"role": "assistant", "content": [{"type": "tool_result", "tool_use_id": "t"}]},
                *HELLO,
            ],
            "max_tokens": 10,
        },
        "messages.1.content.0.type",
    ),
    (
        {
            "messages": [
                *HELLO,
                {"role": "assistant", "content": [{"type": "tool_use", "id": "t", "name": "f"}]},
                *HELLO,
            ],
            "max_tokens": 10,
        },
        "messages.1.content.0.input",
    ),
    ({"messages": [*HELLO, {"role": "assistant", "content": "The"}], "max_tokens": 10}, "prefill"),
    ({"messages": HELLO, "max_tokens": 10, "system": 5}, "system"),
    ({"messages": HELLO, "max_tokens": 10, "system": [{"type": "image"}]}, "system.0"),
    ({"messages": HELLO, "max_tokens": 10, "temperature": 2}, "temperature"),
    ({"messages": HELLO, "max_tokens": 10, "top_p": -1}, "top_p"),
    ({"messages": HELLO, "max_tokens": 10, "top_k": -1}, "top_k"),
    ({"messages": HELLO, "max_tokens": 10, "stop_sequences": "x"}, "stop_sequences"),
    ({"messages": HELLO, "max_tokens": 10, "stop_sequences": ["x"] * 17}, "stop_sequences"),
    ({"messages": HELLO, "max_tokens": 10, "stream": "yes"}, "stream"),
    ({"messages": HELLO, "max_tokens": 10, "metadata": {"user_id": 5}}, "metadata.user_id"),
    ({"messages": HELLO, "max_tokens": 10, "metadata": []}, "metadata"),
    ({"messages": HELLO, "max_tokens": 10, "model": 7}, "model"),
    ({"messages": HELLO, "max_tokens": 10, "thinking": {"type": "on"}}, "thinking.type"),
    ({"messages": HELLO, "max_tokens": 10, "thinking": {"type": "enabled"}}, "budget_tokens"),
    (
        {"messages": HELLO, "max_tokens": 10, "thinking": {"type": "enabled", "budget_tokens": 0}},
        "budget_tokens",
    ),
    ({"messages": HELLO, "max_tokens": 10, "tool_choice": {"type": "any"}}, "needs `tools`"),
    ({"messages": HELLO, "max_tokens": 10, "tool_choice": "auto"}, "tool_choice"),
    (
        {"messages": HELLO, "max_tokens": 10, "tools": [WEATHER], "tool_choice": {"type": "tool"}},
        "tool_choice.name",
    ),
    (
        {"messages": HELLO, "max_tokens": 10, "tools": [{"type": "web_search_20250305"}]},
        "tools.0.type",
    ),
    ({"messages": HELLO, "max_tokens": 10, "tools": [{"name": "f"}]}, "tools.0.input_schema"),
    ({"messages": HELLO, "max_tokens": 10, "tools": {"name": "f"}}, "tools"),
    (
        {"messages": HELLO, "max_tokens": 10, "tools": [{**WEATHER, "name": "bad name!"}]},
        "tools",
    ),
    (
        {"messages": HELLO, "max_tokens": 10, "output_config": {"format": {"type": "xml"}}},
        "output_config.format",
    ),
    ({"messages": HELLO, "max_tokens": 10, "output_format": {"type": "json_schema"}}, "schema"),
    ({"messages": HELLO, "max_tokens": 10, "session_id": "s" * 300}, "session_id"),
]


@pytest.mark.parametrize(("payload", "named"), BAD_BODIES)
async def test_a_bad_request_is_a_400_in_anthropics_shape(post, served, payload, named):
    assert_anthropic_error(await post(payload), 400, "invalid_request_error", named)


@pytest.mark.parametrize(
    "raw", [b"", b"not json", b"[1, 2]", b'{"messages": NaN}', b'{"a": "\\ud800"}']
)
async def test_a_body_that_is_no_json_object_is_a_400_on_both_routes(post, served, raw):
    for path in (MESSAGES, COUNT):
        assert_anthropic_error(await post(raw, path=path), 400, "invalid_request_error")


async def test_count_tokens_validates_as_messages_does(post, served):
    image = {"role": "user", "content": [{"type": "image", "source": {}}]}
    assert_anthropic_error(
        await post({"messages": [image]}, path=COUNT), 400, "invalid_request_error", "image"
    )
    assert_anthropic_error(
        await post({"max_tokens": 5}, path=COUNT), 400, "invalid_request_error", "messages"
    )


async def test_any_model_name_reaches_the_one_loaded_model(post, served):
    reply = (await post(body(model="claude-sonnet-4-5"))).json()
    assert reply["model"] == "smollm2-135m-instruct"


async def test_an_unknown_model_among_several_is_not_found(post, thinker):
    for path in (MESSAGES, COUNT):
        unknown = await post(body(model="no-such-model"), path=path)
        assert_anthropic_error(unknown, 404, "not_found_error", "no-such-model")


async def test_other_refusals_keep_their_status_in_anthropics_shape(post, client, served):
    for path in (MESSAGES, COUNT):
        response = await client.get(path)
        assert_anthropic_error(response, 405, "invalid_request_error", "GET")
        assert "POST" in response["Allow"]
    long = [{"role": "user", "content": "hello " * 9000}]
    too_long = await post({"messages": long, "max_tokens": 5})
    assert_anthropic_error(too_long, 400, "invalid_request_error", "prompt is too long")
    streamed = await post({"messages": long, "max_tokens": 5, "stream": True})
    assert_anthropic_error(streamed, 400, "invalid_request_error", "prompt is too long")


async def test_no_model_loaded_is_overloaded(post, empty_runtime):
    assert_anthropic_error(await post(body()), 503, "overloaded_error")
