"""The tools' system text shows an example call made of the request's own first tool (its
name, its parameters, placeholders of their types), never an invented function or value
a model copies: over 20 seeded compelled calls on the real SmolLM2, no argument carries
anything the example or its rules show. And a call the model wrote that was dropped (an
unknown tool, malformed) is reported on every route: `tool_call_error`, the chat route's
object, in Anthropic's, Responses' and Ollama's answers too (issue 35 item 3)."""

from __future__ import annotations

import json

import pytest

from engine import FinishEvent, TokenEvent, Usage
from engine.tools.dialects import JSON_DIALECT, MINICPM_XML, QWEN_XML, CallError, parse_tools
from engine.tools.dialects.base import example_call

pytestmark = pytest.mark.anyio

MODEL = "smollm2-135m-instruct"
CITY = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 30}},
            "required": ["city"],
        },
    },
}
ASK = [{"role": "user", "content": "What's the weather in Paris? Use a tool."}]
SAMPLES = 20
# What the system text's example and rules show that is not the request's own (and
# what the old example invented).
EXAMPLE_VALUES = ("...", "(the parameter's name)", "value_1", "example_", "several lines")


def example_values_in(text: str) -> list[str]:
    return [v for v in EXAMPLE_VALUES if v in text]


@pytest.mark.parametrize("dialect", [QWEN_XML, MINICPM_XML, JSON_DIALECT], ids=lambda d: d.name)
def test_the_example_is_the_first_tools_own(dialect):
    tools = parse_tools([CITY])
    text = dialect.system_text(tools)
    assert "example_function_name" not in text and "value_1" not in text
    assert example_call(tools) == ("get_weather", "city")
    assert '"name": "get_weather"' in text or "get_weather>" in text or '"get_weather"' in text
    bare = parse_tools([{"type": "function", "function": {"name": "f"}}])
    assert example_call(bare) == ("f", None)
    assert "f" in dialect.system_text(bare)


async def test_no_compelled_call_carries_the_examples_value(post_chat, served):
    leaked = []
    for seed in range(SAMPLES):
        response = await post_chat(
            {
                "messages": ASK,
                "tools": [CITY],
                "tool_choice": "required",
                "temperature": 1.0,
                "seed": seed,
                "max_tokens": 64,
            }
        )
        assert response.status_code == 200, response.content
        message = response.json()["choices"][0]["message"]
        for call in message.get("tool_calls") or ():
            assert call["function"]["name"] == "get_weather"
            arguments = call["function"]["arguments"]
            json.loads(arguments)
            if example_values_in(arguments):
                leaked.append((seed, arguments))
    assert leaked == []


# --- a dropped call is reported on every route ----------------------------------------

DROPPED = CallError("unknown_function", "no tool named 'lookup'", "lookup")
HINT = {"code": "unknown_function", "message": "no tool named 'lookup'", "function": "lookup"}


def dropping(svc, monkeypatch) -> None:
    """The engine answers some text and a call it dropped (a tool not offered)."""
    usage = Usage(9, 3, 0, 12, 8192)
    events = (
        TokenEvent(text="Let me check.", token_ids=(1,)),
        FinishEvent("stop", usage, tool_call_errors=(DROPPED,)),
    )

    async def generate(request):
        for event in events:
            yield event

    monkeypatch.setattr(svc, "generate", generate)


ROUTES = {
    "chat": ("/v1/chat/completions", {"messages": ASK, "tools": [CITY]}),
    "anthropic": (
        "/v1/messages",
        {
            "messages": ASK,
            "max_tokens": 16,
            "tools": [{"name": "get_weather", "input_schema": CITY["function"]["parameters"]}],
        },
    ),
    "responses": (
        "/v1/responses",
        {
            "input": "What's the weather in Paris?",
            "store": False,  # no database here
            "tools": [
                {
                    "type": "function",
                    "name": "get_weather",
                    "parameters": CITY["function"]["parameters"],
                }
            ],
        },
    ),
    "ollama": ("/api/chat", {"model": MODEL, "messages": ASK, "tools": [CITY]}),
}


def hint_of(route: str, body: dict) -> dict | None:
    if route == "chat":
        return body["choices"][0].get("tool_call_error")
    return body.get("tool_call_error")


@pytest.mark.parametrize("route", list(ROUTES))
async def test_a_dropped_call_is_reported_on_every_route(
    route, client, served, smollm2_service, monkeypatch
):
    dropping(smollm2_service, monkeypatch)
    path, body = ROUTES[route]
    response = await client.post(
        path, data=json.dumps({**body, "stream": False}), content_type="application/json"
    )
    assert response.status_code == 200, response.content
    assert hint_of(route, response.json()) == HINT


@pytest.mark.parametrize("route", ["anthropic", "responses", "ollama"])
async def test_a_dropped_call_is_reported_in_the_stream(
    route, client, served, smollm2_service, monkeypatch
):
    dropping(smollm2_service, monkeypatch)
    path, body = ROUTES[route]
    response = await client.post(
        path, data=json.dumps({**body, "stream": True}), content_type="application/json"
    )
    raw = b"".join([chunk async for chunk in response.streaming_content]).decode()
    if route == "ollama":
        last = json.loads(raw.strip().splitlines()[-1])
        assert last["done"] is True and last["tool_call_error"] == HINT
        return
    payloads = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: ")]
    if route == "anthropic":
        (delta,) = [p for p in payloads if p["type"] == "message_delta"]
        assert delta["tool_call_error"] == HINT
    else:
        (done,) = [p for p in payloads if p["type"] == "response.completed"]
        assert done["response"]["tool_call_error"] == HINT
