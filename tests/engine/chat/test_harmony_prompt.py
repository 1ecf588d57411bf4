"""Harmony prompts (gpt-oss): the real gpt-oss chat template renders the tools and the
tool turns it is given, and a harmony model gets the harmony dialect."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine.chat.prompt import PromptBuilder
from engine.text.chat_template import CHATML_TEMPLATE, ChatTemplate
from engine.tools.dialects import HARMONY_DIALECT, QWEN_XML, dialect_for, parse_tools
from engine.tools.prompt import call_plan, for_template

GPTOSS_TEMPLATE = Path(__file__).parents[1] / "text" / "fixtures" / "gpt-oss.jinja"

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "get_weather",
            "description": "The weather of a city",
            "parameters": {
                "type": "object",
                "properties": {
                    "city": {"type": "string", "description": "Its name"},
                    "unit": {"type": "string", "enum": ["c", "f"]},
                },
                "required": ["city"],
            },
        },
    }
]

CONVERSATION = [
    {"role": "system", "content": "Answer briefly."},
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {
        "role": "assistant",
        "content": None,
        "reasoning_content": "Two cities: two calls.",
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
            },
            {
                "id": "c2",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "20 C"},
    {"role": "tool", "tool_call_id": "c2", "content": "25 C"},
]

EXPECTED = (
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
    "Knowledge cutoff: 2024-06\n"
    "Current date: DATE\n\n"
    "Reasoning: medium\n\n"
    "# Valid channels: analysis, commentary, final. Channel must be included for every message.\n"
    "Calls to these tools must go to the commentary channel: 'functions'.<|end|>"
    "<|start|>developer<|message|># Instructions\n\nAnswer briefly.\n\n"
    "# Tools\n\n## functions\n\nnamespace functions {\n\n"
    "// The weather of a city\ntype get_weather = (_: {\n// Its name\ncity: string,\n"
    'unit?: "c" | "f",\n}) => any;\n\n} // namespace functions<|end|>'
    "<|start|>user<|message|>Weather in Paris and Rome?<|end|>"
    "<|start|>assistant<|channel|>analysis<|message|>Two cities: two calls.<|end|>"
    "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
    '{"city": "Paris"}<|call|>'
    "<|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>"
    '{"city": "Rome"}<|call|>'
    "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"
    '"20 C"<|end|>'
    "<|start|>functions.get_weather to=assistant<|channel|>commentary<|message|>"
    '"25 C"<|end|>'
    "<|start|>assistant"
)


def without_date(text: str) -> str:
    return re.sub(r"Current date: \d{4}-\d{2}-\d{2}", "Current date: DATE", text)


@pytest.fixture(scope="module")
def gptoss_template() -> ChatTemplate:
    return ChatTemplate(GPTOSS_TEMPLATE.read_text(), "<|startoftext|>", "<|return|>")


def test_the_real_gptoss_template_renders_tools_and_tool_turns(gptoss_template):
    messages, tools = for_template(CONVERSATION, parse_tools(TOOLS))
    assert tools == TOOLS
    text = gptoss_template.render(messages, add_generation_prompt=True, tools=tools)
    assert without_date(text) == EXPECTED


def test_each_call_gets_its_own_message_with_object_arguments():
    messages, _ = for_template(CONVERSATION, [])
    calls = [m for m in messages if m["role"] == "assistant"]
    assert [m["tool_calls"][0]["function"]["arguments"] for m in calls] == [
        {"city": "Paris"},
        {"city": "Rome"},
    ]
    assert calls[0]["thinking"] == "Two cities: two calls." and "content" not in calls[0]
    assert CONVERSATION[2]["tool_calls"][0]["function"]["arguments"] == '{"city": "Paris"}'


def test_reasoning_effort_is_the_templates_own_variable(gptoss_template):
    text = gptoss_template.render([{"role": "user", "content": "Hi"}], reasoning_effort="high")
    assert "Reasoning: high\n\n" in text
    assert text.endswith("<|start|>user<|message|>Hi<|end|><|start|>assistant")


def test_a_harmony_model_gets_the_harmony_dialect(gptoss_template, smollm2_tokenizer):
    prompts = PromptBuilder("gpt-oss-20b", "gpt-oss", smollm2_tokenizer, gptoss_template, 4096)
    assert prompts.harmony and not prompts.think_style
    assert prompts.tool_dialect is HARMONY_DIALECT
    by_template = PromptBuilder("m", "llama", smollm2_tokenizer, gptoss_template, 4096)
    assert by_template.harmony and by_template.tool_dialect is HARMONY_DIALECT
    plain = PromptBuilder("m", "llama", smollm2_tokenizer, ChatTemplate(CHATML_TEMPLATE), 4096)
    assert not plain.harmony and plain.tool_dialect is QWEN_XML


def test_the_prompt_is_the_templates_rendering(gptoss_template, smollm2_tokenizer):
    prompts = PromptBuilder("gpt-oss-20b", "gpt-oss", smollm2_tokenizer, gptoss_template, 4096)
    ids, think_open = prompts.prepare_chat(
        CONVERSATION, tools=parse_tools(TOOLS), dialect=HARMONY_DIALECT
    )
    assert not think_open
    assert without_date(smollm2_tokenizer.decode(ids)) == EXPECTED


def test_dialect_for_picks_harmony():
    assert dialect_for("anything", harmony=True) is HARMONY_DIALECT
    assert dialect_for("ornith-7b", "gpt-oss") is HARMONY_DIALECT
    assert dialect_for("qwen3") is QWEN_XML


def test_harmony_calls_are_parsed_not_masked():
    assert call_plan(HARMONY_DIALECT, TOOLS, optional=False) is None


@pytest.mark.parametrize(
    ("effort", "line"),
    [
        (None, "Reasoning: medium"),
        ("minimal", "Reasoning: low"),
        ("high", "Reasoning: high"),
        ("max", "Reasoning: high"),
    ],
)
def test_a_turns_reasoning_effort_reaches_the_template(
    gptoss_template, smollm2_tokenizer, effort, line
):
    """The API's effort levels as harmony spells them (the template's default: medium),
    through the core's chat_prompt, with and without truncation."""
    from engine.chat.core import ToolPlan, chat_prompt
    from engine.chat.turn import Turn

    prompts = PromptBuilder("gpt-oss-20b", "gpt-oss", smollm2_tokenizer, gptoss_template, 4096)
    for truncation in ("disabled", "auto"):
        turn = Turn(
            messages=({"role": "user", "content": "Hi"},),
            reasoning_effort=effort,
            truncation=truncation,
        )
        ids, _, _ = chat_prompt(prompts, turn, ToolPlan(), True)
        text = smollm2_tokenizer.decode(ids)
        assert f"{line}\n\n" in text
