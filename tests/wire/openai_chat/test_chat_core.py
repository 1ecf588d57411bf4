"""The chat core (engine/chat) and the OpenAI chat route on it: a named
tool_choice compels its function by default, a compelled call needs tools, context
overflow speaks OpenAI's words, and a call cut by max_tokens is the same streamed or not."""

from __future__ import annotations

import json
import re

import pytest

from engine.chat import ChatOptions, InvalidTurn, Turn, collect, prepare_turn
from engine.tools.dialects import ArgumentsDelta, CallError, CallOpened
from engine.types import FinishEvent, TokenEvent, Usage
from tests.wire.helpers import read_stream
from tests.wire.openai_chat.test_tools import ASK, SCHEMAS, TOOLS, assert_one_valid_call, body

pytestmark = pytest.mark.anyio

SEARCH = {"type": "function", "function": {"name": "search"}}
OVERFLOW = re.compile(
    r"^This model's maximum context length is (\d+) tokens\. However, your messages "
    r"resulted in (at least )?(\d+) tokens\."
)


# --- tool_choice ------------------------------------------------------------------------


async def test_a_named_tool_choice_compels_that_function_by_default(post_chat, served, settings):
    settings.PANTHEON_TOOL_GRAMMAR = None  # unset: the default
    for seed in range(3):
        response = await post_chat(body(tool_choice=SEARCH, temperature=1.0, seed=seed))
        assert response.status_code == 200, response.content
        choice = response.json()["choices"][0]
        call = assert_one_valid_call(choice["message"], choice["finish_reason"])
        assert call["function"]["name"] == "search"


def test_tool_grammar_off_still_turns_the_named_grammar_off(smollm2_service):
    turn = Turn(messages=tuple(ASK), tools=tuple(TOOLS), tool_choice=SEARCH)
    armed = prepare_turn(smollm2_service, turn, ChatOptions(tool_grammar=None))
    off = prepare_turn(smollm2_service, turn, ChatOptions(tool_grammar=False))
    assert armed.request.constraint is not None and armed.request.tool_compelled
    assert off.request.constraint is None and off.tools.only == "search"


@pytest.mark.parametrize("choice", ["required", SEARCH])
async def test_a_compelled_call_without_tools_is_400(post_chat, served, choice):
    response = await post_chat({"messages": ASK, "tool_choice": choice, "max_tokens": 4})
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["param"] == "tool_choice"


@pytest.mark.parametrize("choice", ["required", SEARCH])
def test_the_core_refuses_a_compelled_call_without_tools(smollm2_service, choice):
    # Every wire format goes through this check, whatever its own validation does.
    with pytest.raises(InvalidTurn) as refused:
        prepare_turn(smollm2_service, Turn(messages=tuple(ASK), tool_choice=choice))
    assert refused.value.param == "tool_choice"


# --- context overflow ---------------------------------------------------------------------


@pytest.mark.parametrize("stream", [False, True])
async def test_context_overflow_speaks_openais_words_first(
    post_chat, served, smollm2_service, stream
):
    window = smollm2_service.context_window_configured
    giant = [{"role": "user", "content": "hello " * (window + 100)}]
    response = await post_chat({"messages": giant, "stream": stream})
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["type"] == "context_over_budget"
    # OpenAI's code (the OpenAI SDK's and LangChain's overflow), our numbers beside it
    assert error["code"] == "context_length_exceeded"
    assert error["context_window"] == window and error["prompt_tokens"] > window
    match = OVERFLOW.match(error["message"])
    assert match, error["message"]
    assert int(match[1]) == window and int(match[3]) > window
    # Our own detail follows: the numbers a client can act on.
    assert f"kv_used={match[3]}" in error["message"]
    assert f"kv_cap={window}" in error["message"]
    if stream:
        assert (error["kv_used"], error["kv_cap"]) == (int(match[3]), window)


# --- a call cut by max_tokens ----------------------------------------------------------------


def joined_stream(events: list[dict]) -> tuple[dict, str]:
    """A stream's chunks joined as a client joins them: (message, finish_reason)."""
    content, calls, finish = "", {}, None
    for e in events:
        if e == "[DONE]" or "choices" not in e:
            continue
        for choice in e["choices"]:
            delta = choice["delta"]
            content += delta.get("content") or ""
            for tc in delta.get("tool_calls", []):
                call = calls.setdefault(tc["index"], {"function": {"arguments": ""}})
                if "id" in tc:
                    call.update(id=tc["id"], type=tc["type"])
                    call["function"]["name"] = tc["function"]["name"]
                call["function"]["arguments"] += tc["function"]["arguments"]
            finish = choice["finish_reason"] or finish
    message = {"content": content or None}
    if calls:
        message["tool_calls"] = [calls[i] for i in sorted(calls)]
    return message, finish


async def test_a_call_cut_by_max_tokens_is_the_same_streamed_or_not(post_chat, served):
    # Greedy: both requests write the same tokens; 14 of them end inside the call.
    request = body(tool_choice="required", temperature=0, max_tokens=14)
    plain = (await post_chat(request)).json()["choices"][0]
    streamed, finish = joined_stream(
        await read_stream(await post_chat({**request, "stream": True}))
    )
    assert plain["finish_reason"] == finish == "length"
    assert plain["tool_call_error"]["code"] == "incomplete_call"
    [cut] = plain["message"]["tool_calls"]
    [announced] = streamed["tool_calls"]
    assert cut["id"].startswith("call_") and announced["id"].startswith("call_")
    assert cut["type"] == announced["type"] == "function"
    assert cut["function"] == announced["function"]  # the name, the arguments as written
    assert cut["function"]["name"] in SCHEMAS
    assert plain["message"]["content"] is streamed["content"] is None


async def _events(*events):
    for event in events:
        yield event


async def test_collect_keeps_a_cut_call_with_its_id_and_drops_a_failed_one():
    usage = Usage(prompt_tokens=3, completion_tokens=9, cached_tokens=0, kv_used=12, kv_cap=64)
    opened = TokenEvent(
        text="",
        token_ids=(1,),
        tool_calls=(CallOpened(0, "call_a", "search"), ArgumentsDelta(0, '{"query": "x"')),
    )
    cut = FinishEvent(
        "length", usage, tool_call_errors=(CallError("incomplete_call", "cut", "search"),)
    )
    result = await collect(_events(opened, cut))
    [call] = result.choices[0].tool_calls
    assert (call.id, call.name, call.arguments, call.complete) == (
        "call_a",
        "search",
        '{"query": "x"',
        False,
    )
    # A call that failed for another reason (a bad argument) stays out, as before.
    failed = FinishEvent(
        "stop", usage, tool_call_errors=(CallError("invalid_argument", "bad", "search"),)
    )
    assert (await collect(_events(opened, failed))).choices[0].tool_calls == []


async def test_collect_renders_complete_calls_as_their_parsed_arguments():
    from engine.tools.dialects import ParsedCall

    usage = Usage(prompt_tokens=3, completion_tokens=9, cached_tokens=0, kv_used=12, kv_cap=64)
    call = ParsedCall("call_b", "search", {"query": "x", "filters": {"max_results": 2}})
    pieces = ('{"query": "x"', ', "filters": {"max_results": 2}', "}")
    stream = TokenEvent(
        text="",
        token_ids=(1,),
        tool_calls=(CallOpened(0, "call_b", "search"), *(ArgumentsDelta(0, p) for p in pieces)),
    )
    result = await collect(_events(stream, FinishEvent("tool_calls", usage, tool_calls=(call,))))
    [joined] = result.choices[0].tool_calls
    assert joined.arguments == "".join(pieces) == json.dumps(call.arguments)
    assert joined.complete and result.usage.total_tokens == 12
