"""wire.responses.request: Responses request shapes in chat-core terms (no model needed)."""

from __future__ import annotations

import pytest

from pantheon_platform.errors import ApiError
from wire.responses.request import input_messages, parse_request


def test_items_become_chat_messages():
    messages = input_messages(
        [
            {"role": "developer", "content": "Be brief."},
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
            {
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "t1"}],
            },
            {
                "type": "message",
                "role": "assistant",
                "content": [{"type": "output_text", "text": "Let me look."}],
            },
            {
                "type": "reasoning",
                "summary": [],
                "content": [{"type": "reasoning_text", "text": "t2"}],
            },
            {"type": "function_call", "call_id": "c1", "name": "f", "arguments": '{"a": 1}'},
            {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "c1", "output": "one"},
            {
                "type": "function_call_output",
                "call_id": "c2",
                "output": [{"type": "input_text", "text": "two"}],
            },
            {"type": "function_call", "call_id": "c3", "name": "f", "arguments": "{}"},
        ]
    )
    assert messages == [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {
            "role": "assistant",
            "content": "Let me look.",
            "reasoning_content": "t1t2",
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "f", "arguments": '{"a": 1}'},
                },
                {"id": "c2", "type": "function", "function": {"name": "g", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "one"},
        {"role": "tool", "tool_call_id": "c2", "content": "two"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {"id": "c3", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
    ]


def test_tools_choice_format_and_effort_map_to_the_chat_shape():
    req = parse_request(
        {
            "input": "hi",
            "tools": [
                {"type": "function", "name": "f", "parameters": {"type": "object"}, "strict": True}
            ],
            "tool_choice": {"type": "function", "name": "f"},
            "text": {"format": {"type": "json_schema", "name": "x", "schema": {"type": "object"}}},
            "reasoning": {"effort": "medium"},
            "max_output_tokens": 10**9,
        }
    )
    assert req.tools == (
        {
            "type": "function",
            "function": {"name": "f", "parameters": {"type": "object"}, "strict": True},
        },
    )
    assert req.tool_choice == {"type": "function", "function": {"name": "f"}}
    assert req.response_format == {
        "type": "json_schema",
        "json_schema": {"name": "x", "schema": {"type": "object"}},
    }
    assert (req.enable_thinking, req.reasoning_budget) == (True, 2048)
    assert req.sampling().max_tokens == 1_048_576  # clamped as the chat route does
    off = parse_request({"input": "hi", "reasoning": {"effort": "minimal"}})
    assert (off.enable_thinking, off.reasoning_budget) == (False, None)
    default = parse_request({"input": "hi"})
    assert (default.enable_thinking, default.reasoning_budget, default.store) == (None, None, True)


def test_input_may_be_empty_only_when_continuing():
    assert parse_request({"previous_response_id": "resp_x"}).input_messages == ()
    with pytest.raises(ApiError, match="input"):
        parse_request({})
