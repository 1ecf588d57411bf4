"""Replayed assistant turns render to the text the model produced, so the prefix cache
hits: `reasoning_content` back inside its think block, `tool_calls` back in the call
syntax, on templates shaped like the think-style and tool-calling ones models ship.

The property the session cache needs: render(turn 1, generation prompt) followed by what
the model generated is a prefix of render(turn 2). These templates are small stand-ins
written here in the shape of Qwen3's (think block before the content, calls as JSON in
<tool_call> tags); the engine passes the replayed fields through untouched.
"""

from __future__ import annotations

import json

from engine.text.chat_template import ChatTemplate

THINK_AND_TOOLS_TEMPLATE = """
{%- for m in messages -%}
{%- if m.role == 'assistant' -%}
<|im_start|>assistant
{% if m.reasoning_content %}<think>
{{ m.reasoning_content }}
</think>

{% endif %}{{ m.content }}
{%- for call in m.tool_calls or [] -%}
{%- if not loop.first or m.content %}{{ '\n' }}{% endif -%}
<tool_call>
{"name": "{{ call.function.name }}", "arguments": {% if call.function.arguments is string %}{{ call.function.arguments }}{% else %}{{ call.function.arguments | tojson }}{% endif %}}
</tool_call>
{%- endfor -%}
<|im_end|>
{% elif m.role == 'tool' -%}
<|im_start|>user
<tool_response>
{{ m.content }}
</tool_response><|im_end|>
{% else -%}
<|im_start|>{{ m.role }}
{{ m.content }}<|im_end|>
{% endif -%}
{%- endfor -%}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif -%}
"""

TEMPLATE = ChatTemplate(THINK_AND_TOOLS_TEMPLATE)
USER = {"role": "user", "content": "What is the weather in Paris?"}
NEXT = {"role": "user", "content": "Thanks. And tomorrow?"}


def assert_replay_continues(produced: str, assistant: dict) -> None:
    turn_1 = TEMPLATE.render([USER], add_generation_prompt=True)
    turn_2 = TEMPLATE.render([USER, assistant, NEXT], add_generation_prompt=True)
    assert turn_2.startswith(turn_1 + produced), (turn_1 + produced, turn_2)


def test_reasoning_content_renders_back_into_its_think_block():
    produced = "<think>\nThe user wants weather.\n</think>\n\nIt is sunny.<|im_end|>"
    assert_replay_continues(
        produced,
        {
            "role": "assistant",
            "content": "It is sunny.",
            "reasoning_content": "The user wants weather.",
        },
    )


def test_tool_calls_render_back_in_the_call_syntax_with_string_arguments():
    arguments = {"city": "Paris", "days": 1}
    produced = (
        "<tool_call>\n"
        f'{{"name": "get_weather", "arguments": {json.dumps(arguments)}}}\n'
        "</tool_call><|im_end|>"
    )
    call = {
        "id": "call_1",
        "type": "function",
        "function": {"name": "get_weather", "arguments": json.dumps(arguments)},
    }
    assert_replay_continues(produced, {"role": "assistant", "content": "", "tool_calls": [call]})


def test_reasoning_then_a_call_then_the_tool_result():
    produced = (
        "<think>\nI should call the tool.\n</think>\n\n"
        "Let me check.\n<tool_call>\n"
        '{"name": "get_weather", "arguments": {"city": "Paris"}}\n'
        "</tool_call><|im_end|>"
    )
    assistant = {
        "role": "assistant",
        "content": "Let me check.",
        "reasoning_content": "I should call the tool.",
        "tool_calls": [
            {
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            }
        ],
    }
    assert_replay_continues(produced, assistant)
    tool = {"role": "tool", "tool_call_id": "call_1", "content": '{"temp": 21}'}
    with_result = TEMPLATE.render([USER, assistant, tool], add_generation_prompt=True)
    assert with_result.startswith(TEMPLATE.render([USER]) + produced)


def test_null_content_with_tool_calls_renders_like_empty_content():
    """OpenAI clients send `content: null` on a pure tool call."""
    call = {"type": "function", "function": {"name": "f", "arguments": "{}"}}
    a = TEMPLATE.render([USER, {"role": "assistant", "content": None, "tool_calls": [call]}])
    b = TEMPLATE.render([USER, {"role": "assistant", "content": "", "tool_calls": [call]}])
    assert a == b
