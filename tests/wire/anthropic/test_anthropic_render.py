"""The Anthropic renderer alone: the core's events (as the engine emits them) into content
blocks and stream events, joined by the anthropic SDK's own accumulator: the streamed
message is the non-streamed one, a call cut by max_tokens included."""

from __future__ import annotations

import pytest

from engine.tools.dialects import ArgumentsDelta, CallOpened, ParsedCall
from engine.types import FinishEvent, TokenEvent, Usage
from wire.anthropic.render import Blocks, message_json, stop_reason, usage_json

USAGE = Usage(prompt_tokens=30, completion_tokens=12, cached_tokens=10, kv_used=42, kv_cap=128)


def token(text="", reasoning="", calls=()) -> TokenEvent:
    return TokenEvent(text=text, token_ids=(1,), reasoning=reasoning, tool_calls=tuple(calls))


def sdk_join(blocks: Blocks, events, finish: FinishEvent) -> dict:
    """The stream our renderer sends for `events`, joined by the SDK's accumulator."""
    streaming = pytest.importorskip("anthropic.lib.streaming._messages")
    start = message_json("msg_1", "m", [], None, usage_json(USAGE))
    raw = [{"type": "message_start", "message": start}]
    for event in events:
        raw += [payload for _, payload in blocks.push(event)]
    raw += [payload for _, payload in blocks.close()]
    reason, sequence = stop_reason(finish)
    raw.append(
        {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": usage_json(finish.usage),
        }
    )
    snapshot, buffers = None, {}
    for payload in raw:
        snapshot = streaming.accumulate_event(
            event=payload, current_snapshot=snapshot, json_bufs=buffers
        )
    return snapshot.model_dump(exclude_none=True)


def test_thinking_text_and_a_call_in_order_streamed_as_not():
    events = [
        token(reasoning="The user wants "),
        token(reasoning="weather."),
        token(text="Let me check."),
        token(calls=[CallOpened(0, "call_1", "get_weather")]),
        token(calls=[ArgumentsDelta(0, '{"city": "Paris"')]),
        token(calls=[ArgumentsDelta(0, ', "unit": "c"'), ArgumentsDelta(0, "}")]),
    ]
    finish = FinishEvent(
        "tool_calls",
        USAGE,
        tool_calls=(ParsedCall("call_1", "get_weather", {"city": "Paris", "unit": "c"}),),
    )
    joined = sdk_join(Blocks(), events, finish)
    blocks = Blocks()
    for event in events:
        blocks.push(event)
    content = blocks.content(finish)
    assert content == [
        {"type": "thinking", "thinking": "The user wants weather.", "signature": ""},
        {"type": "text", "text": "Let me check."},
        {
            "type": "tool_use",
            "id": "call_1",
            "name": "get_weather",
            "input": {"city": "Paris", "unit": "c"},
        },
    ]
    assert joined["content"] == content
    assert joined["stop_reason"] == "tool_use"
    assert (
        joined["usage"]["input_tokens"] == 20 and joined["usage"]["cache_read_input_tokens"] == 10
    )


def test_a_call_cut_by_max_tokens_is_in_both_with_the_members_written():
    events = [
        token(calls=[CallOpened(0, "call_1", "get_weather")]),
        token(calls=[ArgumentsDelta(0, '{"city": "Paris"')]),
    ]
    finish = FinishEvent("length", USAGE)
    joined = sdk_join(Blocks(), events, finish)
    blocks = Blocks()
    for event in events:
        blocks.push(event)
    content = blocks.content(finish)
    assert content == [
        {"type": "tool_use", "id": "call_1", "name": "get_weather", "input": {"city": "Paris"}}
    ]
    assert joined["content"] == content and joined["stop_reason"] == "max_tokens"
    opened_only = Blocks()
    opened_only.push(events[0])
    assert opened_only.content(finish)[0]["input"] == {}


def test_stop_reasons():
    assert stop_reason(FinishEvent("stop", USAGE)) == ("end_turn", None)
    assert stop_reason(FinishEvent("stop", USAGE, stop_sequence="###")) == ("stop_sequence", "###")
    assert stop_reason(FinishEvent("length", USAGE)) == ("max_tokens", None)
    assert stop_reason(FinishEvent("repetition_loop", USAGE)) == ("end_turn", None)
