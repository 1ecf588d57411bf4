"""Tool calling through POST /v1/chat/completions on the real SmolLM2: grammar-compelled
calls with typed arguments, streamed and not, named calls, and an agent loop."""

from __future__ import annotations

import json

import jsonschema
import pytest

from engine.tools.dialects import MINICPM_XML, parse_tools
from tests.wire.helpers import read_stream

pytestmark = pytest.mark.anyio

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "Current weather for a city.",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "maxLength": 30},
                    "unit": {"enum": ["c", "f"]},
                    "days": {"type": "integer", "minimum": 1, "maximum": 14},
                },
                "required": ["city", "unit"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "create_event",
            "description": "Put an event in the calendar.",
            "parameters": {
                "type": "object",
                "properties": {
                    "title": {"type": "string", "maxLength": 40},
                    "attendees": {
                        "type": "array",
                        "maxItems": 3,
                        "items": {
                            "type": "object",
                            "properties": {"name": {"type": "string", "maxLength": 20}},
                            "required": ["name"],
                            "additionalProperties": False,
                        },
                    },
                    "all_day": {"type": "boolean"},
                },
                "required": ["title", "attendees", "all_day"],
            },
        },
    },
    {
        "type": "function",
        "function": {
            "name": "search",
            "description": "Search the web.",
            "parameters": {
                "type": "object",
                "properties": {
                    "query": {"type": "string", "maxLength": 40},
                    "filters": {
                        "type": "object",
                        "properties": {"max_results": {"type": "integer", "maximum": 10}},
                        "required": ["max_results"],
                        "additionalProperties": False,
                    },
                },
                "required": ["query", "filters"],
            },
        },
    },
]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
ASK = [{"role": "user", "content": "What's the weather in Paris? Use a tool."}]


def body(**extra) -> dict:
    return {"messages": ASK, "tools": TOOLS, "max_tokens": 160, **extra}


def assert_one_valid_call(message: dict, finish_reason: str) -> dict:
    assert finish_reason == "tool_calls"
    [call] = message["tool_calls"]
    assert call["type"] == "function" and call["id"].startswith("call_")
    arguments = json.loads(call["function"]["arguments"])
    jsonschema.validate(arguments, SCHEMAS[call["function"]["name"]])
    return call


async def test_required_sampled_calls_are_all_valid(post_chat, served):
    names = set()
    for seed in range(4):
        response = await post_chat(body(tool_choice="required", temperature=1.0, seed=seed))
        assert response.status_code == 200, response.content
        choice = response.json()["choices"][0]
        call = assert_one_valid_call(choice["message"], choice["finish_reason"])
        assert "<tool_call>" not in (choice["message"]["content"] or "")
        names.add(call["function"]["name"])
    assert names  # at least one tool; usually several


async def test_required_streamed_calls_are_valid_and_never_leak_markup(post_chat, served):
    for seed in range(10, 14):
        response = await post_chat(
            body(tool_choice="required", temperature=1.0, seed=seed, stream=True)
        )
        events = await read_stream(response)
        opened, arguments, content, finish = None, "", "", None
        for e in events[:-1]:
            for choice in e["choices"]:
                delta = choice["delta"]
                content += delta.get("content") or ""
                for tc in delta.get("tool_calls", []):
                    if "id" in tc:
                        assert opened is None  # one call
                        opened = tc
                        assert tc["function"]["arguments"] == ""
                    else:
                        arguments += tc["function"]["arguments"]
                finish = choice["finish_reason"] or finish
        assert "<tool_call>" not in content and "<function" not in content
        message = {
            "tool_calls": [
                {**opened, "function": {"name": opened["function"]["name"], "arguments": arguments}}
            ]
        }
        assert_one_valid_call(message, finish)


async def test_streamed_call_equals_the_non_streamed_one(post_chat, served):
    plain = (await post_chat(body(tool_choice="required", temperature=0))).json()
    events = await read_stream(
        await post_chat(body(tool_choice="required", temperature=0, stream=True))
    )
    arguments = "".join(
        tc["function"]["arguments"]
        for e in events[:-1]
        for c in e["choices"]
        for tc in c["delta"].get("tool_calls", [])
    )
    names = [
        tc["function"]["name"]
        for e in events[:-1]
        for c in e["choices"]
        for tc in c["delta"].get("tool_calls", [])
        if "id" in tc
    ]
    [call] = plain["choices"][0]["message"]["tool_calls"]
    assert names == [call["function"]["name"]]
    assert arguments == call["function"]["arguments"]
    assert plain["choices"][0]["message"]["content"] is None


async def test_a_named_tool_choice_with_the_grammar_on_always_calls_it(post_chat, served, settings):
    settings.PANTHEON_TOOL_GRAMMAR = True
    named = {"type": "function", "function": {"name": "search"}}
    for seed in range(5):
        response = await post_chat(body(tool_choice=named, temperature=1.0, seed=seed))
        choice = response.json()["choices"][0]
        call = assert_one_valid_call(choice["message"], choice["finish_reason"])
        assert call["function"]["name"] == "search"


async def test_tool_choice_none_ignores_the_tools(post_chat, served):
    response = await post_chat(body(tool_choice="none", temperature=0, max_tokens=12))
    message = response.json()["choices"][0]["message"]
    assert "tool_calls" not in message and message["content"]


async def test_bad_tools_and_tool_choice_are_400(post_chat, served):
    bad = [
        body(tools=[{"type": "function", "function": {"name": ""}}]),
        body(tool_choice={"type": "function", "function": {"name": "nope"}}),
        body(tool_choice="sometimes"),
    ]
    for b in bad:
        response = await post_chat(b)
        assert response.status_code == 400, b
        assert response.json()["error"]["type"] == "invalid_request_error"


async def test_an_agent_loop_uses_the_tool_result_and_the_session_cache(post_chat, served):
    first = (
        await post_chat(body(tool_choice="required", temperature=0, session_id="agent"))
    ).json()
    message = first["choices"][0]["message"]
    call = assert_one_valid_call(message, first["choices"][0]["finish_reason"])
    history = [
        *ASK,
        {"role": "assistant", "content": None, "tool_calls": message["tool_calls"]},
        {"role": "tool", "tool_call_id": call["id"], "content": '{"temperature_c": 31}'},
    ]
    second = (
        await post_chat(
            {
                "messages": history,
                "tools": TOOLS,
                "temperature": 0,
                "max_tokens": 48,
                "session_id": "agent",
            }
        )
    ).json()
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
    answer = second["choices"][0]
    assert answer["finish_reason"] in ("stop", "length", "tool_calls")
    # The result reached the model: SmolLM2 (135M) answers from it (it repeats it).
    assert "31" in (answer["message"]["content"] or "")
    assert (
        second["usage"]["prompt_tokens_details"]["cached_tokens"]
        >= (first["usage"]["prompt_tokens"])
    )


async def test_auto_with_the_grammar_on_masks_a_call_once_it_opens(post_chat, served, settings):
    settings.PANTHEON_TOOL_GRAMMAR = True
    for seed in range(3):
        response = await post_chat(body(tool_choice="auto", temperature=1.0, seed=seed))
        choice = response.json()["choices"][0]
        message = choice["message"]
        if message.get("tool_calls"):
            assert_one_valid_call(message, choice["finish_reason"])
        else:
            assert "<tool_call>" not in message["content"]


async def test_a_required_call_is_compelled_after_a_free_think_block(post_chat, thinker):
    response = await post_chat(
        body(
            model="thinker",
            tool_choice="required",
            temperature=0,
            enable_thinking=True,
            reasoning_budget=8,
            max_tokens=200,
        )
    )
    choice = response.json()["choices"][0]
    assert choice["message"].get("reasoning_content")
    assert_one_valid_call(choice["message"], choice["finish_reason"])


async def test_models_say_which_can_compel_a_call_after_thinking(client, thinker, settings):
    rows = {m["id"]: m for m in (await client.get("/v1/models")).json()["data"]}
    assert rows["thinker"]["tool_choice_required_with_thinking"] is True
    assert rows["smollm2-135m-instruct"]["tool_choice_required_with_thinking"] is False
    settings.PANTHEON_TOOL_GRAMMAR = False  # no grammar: nothing can be compelled
    rows = {m["id"]: m for m in (await client.get("/v1/models")).json()["data"]}
    assert rows["thinker"]["tool_choice_required_with_thinking"] is False


LOOKUP = [
    {
        "type": "function",
        "function": {
            "name": "lookup",
            "description": "Look a word up.",
            "parameters": {
                "type": "object",
                "properties": {
                    "word": {"type": "string", "maxLength": 20},
                    "limit": {"type": "integer", "minimum": 1, "maximum": 9},
                },
                "required": ["word"],
            },
        },
    }
]


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_a_compelled_call_the_model_ends_early_is_closed_by_the_server(
    post_chat, served, smollm2_service, stream
):
    """The end token, pushed up by +100, is refused until `word` is written; the model then
    ends the turn before the closing tags, and the server appends them."""
    eos = smollm2_service.tokenizer.eos_id
    request = {
        "messages": [{"role": "user", "content": "Define 'apple'."}],
        "tools": LOOKUP,
        "tool_choice": "required",
        "temperature": 0,
        "max_tokens": 60,
        "logit_bias": {str(eos): 100},
        "stream": stream,
    }
    response = await post_chat(request)
    if stream:
        events = await read_stream(response)
        deltas = [
            tc for e in events[:-1] for c in e["choices"] for tc in c["delta"].get("tool_calls", [])
        ]
        [finish] = [c for e in events[:-1] for c in e["choices"] if c["finish_reason"]]
        assert "tool_call_error" not in finish
        name = [tc["function"]["name"] for tc in deltas if "id" in tc]
        arguments = "".join(tc["function"]["arguments"] for tc in deltas)
        message = {
            "tool_calls": [
                {
                    "id": "call_x",
                    "type": "function",
                    "function": {"name": name[0], "arguments": arguments},
                }
            ]
        }
        reason = finish["finish_reason"]
    else:
        data = response.json()
        choice = data["choices"][0]
        assert "tool_call_error" not in choice
        message, reason = choice["message"], choice["finish_reason"]
        assert data["usage"]["completion_tokens"] < 60  # ended by the model, not the limit
    assert reason == "tool_calls"
    [call] = message["tool_calls"]
    arguments = json.loads(call["function"]["arguments"])
    # The end came at the first place the call could close: right after `word`.
    assert list(arguments) == ["word"] and arguments["word"]


async def test_a_minicpm_like_model_calls_in_the_attribute_dialect(post_chat, minicpm_like):
    assert minicpm_like.tool_dialect is MINICPM_XML
    ids, _ = minicpm_like.prepare_chat(ASK, tools=parse_tools(TOOLS), dialect=MINICPM_XML)
    prompt = minicpm_like.tokenizer.decode(ids)
    assert '<function name="get_weather">' in prompt and '<parameter name="city">' in prompt
    for seed in range(3):
        response = await post_chat(
            body(model="minicpm-like", tool_choice="required", temperature=1.0, seed=seed)
        )
        choice = response.json()["choices"][0]
        assert_one_valid_call(choice["message"], choice["finish_reason"])
        assert choice["message"]["content"] is None
