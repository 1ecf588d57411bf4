"""Offered tools into the conversation, in the dialect the model's calls are parsed in.

The tools' description goes into the system turn (merged with a leading `system`
message, else a new one first). Assistant turns that carried `tool_calls` get those calls
back as the text the model writes for them, after their content, and `tool` results as
the dialect's result text: the history renders to the tokens the model produced, so a
session's prefix cache keeps hitting across an agent loop.
"""

from __future__ import annotations

import json

from ..decoding.response_format import plan_response_format
from .dialects import Dialect, ToolSpec, parse_tools
from .grammar import tool_call_plan


def with_tools(messages: list[dict], tools: list[ToolSpec], dialect: Dialect) -> list[dict]:
    """Copies of `messages` with the tools and the tool turns rendered as text."""
    out = [dict(m) for m in messages]
    if tools:
        system = dialect.system_text(tools)
        if out and out[0].get("role") == "system":
            first = out[0].get("content")
            first = first if isinstance(first, str) else ""
            out[0]["content"] = f"{first}\n\n{system}" if first else system
        else:
            out.insert(0, {"role": "system", "content": system})
    names = {}
    for m in out:
        calls = m.pop("tool_calls", None) if m.get("role") == "assistant" else None
        if calls:
            content = m.get("content")
            text = content if isinstance(content, str) else ""
            for call in calls:
                name, arguments = _call_of(call)
                if call.get("id"):
                    names[call["id"]] = name
                text += dialect.render_call(name, arguments)
            m["content"] = text
        elif m.get("role") == "tool":
            content = m.get("content")
            content = content if isinstance(content, str) else json.dumps(content)
            m["content"] = dialect.render_result(content, names.get(m.get("tool_call_id")))
    return out


def for_template(messages: list[dict], tools: list[ToolSpec]) -> tuple[list[dict], list[dict]]:
    """(messages, tools) for a template that renders tools and tool turns itself
    (harmony): the tools as OpenAI entries, each assistant call in a message of its own
    (the gpt-oss template renders only a message's first call) with its arguments as an
    object, `reasoning_content` as the template's `thinking`, results as text."""
    out: list[dict] = []
    for message in messages:
        m = dict(message)
        if m.get("role") == "tool" and not isinstance(m.get("content"), str | list):
            m["content"] = json.dumps(m.get("content"))
        calls = m.pop("tool_calls", None) if m.get("role") == "assistant" else None
        if not calls:
            out.append(m)
            continue
        reasoning = m.pop("reasoning_content", None)
        if isinstance(reasoning, str) and reasoning:
            m["thinking"] = reasoning  # the template refuses content and thinking both
            m.pop("content", None)
        for i, call in enumerate(calls):
            name, arguments = _call_of(call)
            one = m if i == 0 else {"role": "assistant", "content": ""}
            entry = {"name": name, "arguments": arguments}
            one["tool_calls"] = [{"id": call.get("id"), "type": "function", "function": entry}]
            out.append(one)
    listed = [
        {
            "type": "function",
            "function": {"name": t.name, "description": t.description, "parameters": t.parameters},
        }
        for t in tools
    ]
    return out, listed


def _call_of(call: dict) -> tuple[str, dict]:
    """(name, arguments) of an OpenAI tool call; arguments arrive as a JSON string."""
    function = call.get("function") if isinstance(call, dict) else None
    if not isinstance(function, dict) or not isinstance(function.get("name"), str):
        raise ValueError("tool_calls: each call needs function.name")
    arguments = function.get("arguments", "{}")
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments or "{}")
        except ValueError:
            raise ValueError(
                f"tool_calls: the arguments of {function['name']!r} are not valid JSON"
            ) from None
    if not isinstance(arguments, dict):
        raise ValueError(f"tool_calls: the arguments of {function['name']!r} must be an object")
    return function["name"], arguments


def call_plan(dialect: Dialect, tools: list[dict], only: str | None = None, optional: bool = False):
    """The grammar that compels one well-formed call to an offered tool (or to `only`):
    the XML dialects' own grammar, or for the JSON dialect a JSON schema of the call.
    `optional` ("auto"): free text, and a call held to the grammar once its opener
    appears (XML dialects; None for the JSON dialect, whose calls are not masked).
    A compelled XML call may end where only its closing tags are missing (the output
    appends them: ChoiceOutput.finish). None for a dialect the template renders
    (harmony): its calls are parsed, not masked."""
    if dialect.renders_in_template:
        return None
    tags = getattr(dialect, "tags", None)
    if tags is not None:
        return tool_call_plan(tools, only, optional=optional, tags=tags, closable=not optional)
    if optional:
        return None
    variants = []
    for spec in parse_tools(tools):
        if only is not None and spec.name != only:
            continue
        variants.append(
            {
                "type": "object",
                "properties": {
                    "name": {"const": spec.name},
                    "arguments": spec.parameters or {"type": "object"},
                },
                "required": ["name", "arguments"],
                "additionalProperties": False,
            }
        )
    if not variants:
        raise ValueError(f"no offered tool is named {only!r}")
    schema = variants[0] if len(variants) == 1 else {"anyOf": variants}
    return plan_response_format(
        {"type": "json_schema", "json_schema": {"name": "tool_call", "schema": schema}}
    )
