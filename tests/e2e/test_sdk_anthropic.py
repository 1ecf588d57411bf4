"""The Anthropic Messages API through the unmodified official `anthropic` SDK and
LangChain's ChatAnthropic, against the real server (Daphne, SmolLM2) with API keys on:
the SDK sends its key as `x-api-key`, and the think-style model is SmolLM2 behind a
think template loaded through the operator route."""

from __future__ import annotations

import httpx
import jsonschema
import pytest

from tests.e2e.daphne_server import running_server
from tests.wire.helpers import THINK_TEMPLATE

MODEL = "smollm2-135m-instruct"
CLIENT_KEY = "sk-anthropic-e2e-client"
ADMIN_KEY = "sk-anthropic-e2e-admin"
HELLO = [{"role": "user", "content": "What is the capital of France?"}]
WEATHER = {
    "name": "get_weather",
    "description": "Current weather for a city.",
    "input_schema": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 30}, "unit": {"enum": ["c", "f"]}},
        "required": ["city", "unit"],
    },
}
CAPITAL = {
    "title": "Capital",
    "description": "A country and its capital city.",
    "type": "object",
    "properties": {
        "country": {"type": "string", "maxLength": 20},
        "capital": {"type": "string", "maxLength": 20},
    },
    "required": ["country", "capital"],
}
ASK = [{"role": "user", "content": "What's the weather in Paris? Use a tool."}]

# The SDK's newest releases dropped `temperature` from messages.create (Anthropic's newest
# models take none); the server still reads it from the body.
GREEDY = {"temperature": 0}

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def server(tmp_path_factory, smollm2_path):
    pytest.importorskip("anthropic")
    with running_server(
        tmp_path_factory.mktemp("pantheon-anthropic"),
        {MODEL: smollm2_path},
        PANTHEON_API_KEY=CLIENT_KEY,
        PANTHEON_ADMIN_API_KEY=ADMIN_KEY,
    ) as srv:
        load = httpx.post(
            srv.url + "/admin/models/load",
            json={"path": str(smollm2_path), "name": "thinker", "chat_template": THINK_TEMPLATE},
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
            timeout=300,
        )
        assert load.status_code == 200, load.text
        yield srv


@pytest.fixture(scope="module")
def client(server):
    import anthropic

    return anthropic.Anthropic(base_url=server.url, api_key=CLIENT_KEY, max_retries=0, timeout=300)


def dump(message) -> dict:
    return message.model_dump(exclude_none=True)


def test_a_message_plain_and_through_the_stream_helper_agree(client):
    request = dict(
        model=MODEL, max_tokens=32, extra_body=GREEDY, messages=HELLO, system="Be brief."
    )
    plain = client.messages.create(**request)
    assert plain.type == "message" and plain.role == "assistant"
    assert plain.content[0].type == "text" and "Paris" in plain.content[0].text
    assert plain.stop_reason in ("end_turn", "max_tokens")
    with client.messages.stream(**request) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == plain.content[0].text
    assert dump(final)["content"] == dump(plain)["content"]
    assert final.stop_reason == plain.stop_reason and final.usage == plain.usage
    kinds = [event.type for event in client.messages.create(**request, stream=True)]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"]
    assert {"content_block_start", "content_block_delta", "content_block_stop"} <= set(kinds)


def test_a_stop_sequence_through_the_sdk(client):
    reply = client.messages.create(
        model=MODEL, max_tokens=32, extra_body=GREEDY, messages=HELLO, stop_sequences=["Paris"]
    )
    assert reply.stop_reason == "stop_sequence" and reply.stop_sequence == "Paris"


def test_a_tool_use_round_trip(client):
    request = dict(model=MODEL, max_tokens=80, extra_body=GREEDY, tools=[WEATHER])
    first = client.messages.create(**request, messages=ASK, tool_choice={"type": "any"})
    assert first.stop_reason == "tool_use"
    [call] = [block for block in first.content if block.type == "tool_use"]
    assert call.name == "get_weather"
    jsonschema.validate(call.input, WEATHER["input_schema"])
    with client.messages.stream(**request, messages=ASK, tool_choice={"type": "any"}) as stream:
        streamed = stream.get_final_message()
    [s_call] = [block for block in streamed.content if block.type == "tool_use"]
    assert (s_call.name, s_call.input) == (call.name, call.input)
    history = [
        *ASK,
        {"role": "assistant", "content": first.content},
        {
            "role": "user",
            "content": [{"type": "tool_result", "tool_use_id": call.id, "content": "31 C, sunny"}],
        },
    ]
    final = client.messages.create(**request, messages=history)
    assert final.stop_reason in ("end_turn", "max_tokens", "tool_use")
    assert final.content


def test_thinking_on_a_think_style_template(client):
    request = dict(
        model="thinker",
        max_tokens=48,
        extra_body=GREEDY,
        messages=HELLO,
        # Small: SmolLM2 (no thinker) often ends its turn inside a longer block.
        thinking={"type": "enabled", "budget_tokens": 4},
    )
    plain = client.messages.create(**request)
    kinds = [block.type for block in plain.content]
    assert kinds[0] == "thinking" and "text" in kinds
    assert plain.content[0].thinking.strip()
    with client.messages.stream(**request) as stream:
        final = stream.get_final_message()
    assert dump(final)["content"] == dump(plain)["content"]
    off = client.messages.create(**{**request, "thinking": {"type": "disabled"}})
    assert [block.type for block in off.content] == ["text"]


def test_count_tokens_is_the_prompt_a_message_reads(client):
    for extra in ({}, {"tools": [WEATHER]}, {"system": "Be brief."}):
        counted = client.messages.count_tokens(model=MODEL, messages=HELLO, **extra)
        reply = client.messages.create(
            model=MODEL, max_tokens=1, extra_body=GREEDY, messages=HELLO, **extra
        )
        assert counted.input_tokens == reply.usage.input_tokens > 0


def test_refusals_are_the_sdks_typed_errors(server, client):
    import anthropic

    wrong = anthropic.Anthropic(base_url=server.url, api_key="not-a-key", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError):
        wrong.messages.create(model=MODEL, max_tokens=4, messages=HELLO)
    image = {"type": "image", "source": {"type": "url", "url": "http://example.com/a.png"}}
    for stream in (False, True):
        with pytest.raises(anthropic.BadRequestError) as caught:
            client.messages.create(
                model=MODEL,
                max_tokens=4,
                stream=stream,
                messages=[{"role": "user", "content": [image]}],
            )
        assert caught.value.body["error"]["type"] == "invalid_request_error"
        assert "image" in caught.value.body["error"]["message"]
    with pytest.raises(anthropic.NotFoundError):
        client.messages.create(model="claude-no-such", max_tokens=4, messages=HELLO)


def test_langchain_chat_anthropic_invokes_streams_and_calls_tools(server, client):
    chat_anthropic = pytest.importorskip("langchain_anthropic")
    llm = chat_anthropic.ChatAnthropic(
        model=MODEL,
        base_url=server.url,
        api_key=CLIENT_KEY,
        max_tokens=32,
        temperature=0,
        max_retries=0,
    )
    question = "What is the capital of France?"
    expected = (
        client.messages.create(model=MODEL, max_tokens=32, extra_body=GREEDY, messages=HELLO)
        .content[0]
        .text
    )
    answer = llm.invoke(question)
    assert answer.text == expected
    assert "".join(chunk.text for chunk in llm.stream(question)) == expected
    tools = llm.model_copy(update={"max_tokens": 80}).bind_tools(
        [WEATHER], tool_choice="get_weather"
    )
    forced = tools.invoke(ASK[0]["content"])
    assert forced.response_metadata["stop_reason"] == "tool_use", forced
    [call] = forced.tool_calls
    assert call["name"] == "get_weather"
    jsonschema.validate(call["args"], WEATHER["input_schema"])


def test_langchain_structured_output_by_tool_and_by_json_schema(server):
    chat_anthropic = pytest.importorskip("langchain_anthropic")
    llm = chat_anthropic.ChatAnthropic(
        model=MODEL,
        base_url=server.url,
        api_key=CLIENT_KEY,
        max_tokens=80,
        temperature=0,
        max_retries=0,
    )
    for method in ("function_calling", "json_schema"):
        structured = llm.with_structured_output(CAPITAL, method=method)
        answer = structured.invoke("What is the capital of France?")
        jsonschema.validate(answer, CAPITAL)
