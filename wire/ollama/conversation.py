"""Ollama's `messages` and `tools` (POST /api/chat) in the neutral (OpenAI chat) shape the
chat core renders, and the schema of a message as the request table shows it.

An assistant's `tool_calls` ({function: {name, arguments: OBJECT}}) get ids and JSON-text
arguments; a `tool` message is tied to its call by `tool_call_id` when given, else by
`tool_name` (the oldest unanswered call of that name), else to the oldest unanswered call.
"""

from __future__ import annotations

import json

from django.conf import settings

from pantheon_platform.errors import invalid_request
from pantheon_platform.strict_json import json_kind, tool_objects
from wire.fields import OLLAMA, Array, Field, Shape, String, Table

MESSAGE_ROLES = ("system", "user", "assistant", "tool")
_STRING = String()
_NON_NEGATIVE = Shape({"type": "integer", "minimum": 0})

# A tool call as a message (and an answer) carries it.
TOOL_CALL = Table(
    Field("id", _STRING, nullable=False),
    Field(
        "function",
        Shape(
            Table(
                Field("index", _NON_NEGATIVE, nullable=False),
                Field("name", _STRING, required=True, nullable=False),
                Field("arguments", Shape({"type": "object"}), required=True, nullable=False),
            ).schema()
        ),
        required=True,
        nullable=False,
    ),
)
MESSAGE = Table(
    Field("role", Shape({"enum": list(MESSAGE_ROLES)}), required=True, nullable=False),
    Field("content", _STRING),
    Field("thinking", _STRING),
    Field(
        "images",
        Array(max_items=0),
        description="Images are a 400 naming the field: no model here reads them.",
    ),
    Field("tool_calls", Array(items=Shape(TOOL_CALL.schema()))),
    Field("tool_name", _STRING),
    Field("tool_call_id", _STRING),
    wording=OLLAMA,
)
TOOL = Table(
    Field("type", Shape({"const": "function"}), nullable=False),
    Field("function", Shape({"type": "object"}), required=True, nullable=False),
)


def refuse_images(value: object, path: str) -> None:
    if value is None or value == []:
        return
    raise invalid_request(
        f"{path}: images are not supported: no model this server runs can read images; send text",
        path,
    )


def _arguments(value: object, path: str) -> str:
    """A call's arguments as JSON text (Ollama sends an object; a JSON string is read)."""
    if isinstance(value, str):
        try:
            value = json.loads(value or "{}")
        except ValueError:
            raise invalid_request(f"{path}: expected an object", path) from None
    if value is None:
        value = {}
    if not isinstance(value, dict):
        raise invalid_request(f"{path}: expected an object, got {json_kind(value)}", path)
    return json.dumps(value, ensure_ascii=False)


def _tool_calls(value: object, path: str, ids: list[str]) -> list[dict]:
    if not isinstance(value, list):
        raise invalid_request(f"{path}: expected an array, got {json_kind(value)}", path)
    calls = []
    for j, call in enumerate(value):
        where = f"{path}.{j}"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict):
            raise invalid_request(f"{where}.function: expected an object", f"{where}.function")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise invalid_request(
                f"{where}.function.name: expected a string", f"{where}.function.name"
            )
        call_id = call.get("id")
        if not isinstance(call_id, str) or not call_id:
            call_id = f"call_{len(ids)}"
        ids.append(call_id)
        calls.append(
            {
                "id": call_id,
                "type": "function",
                "function": {
                    "name": name,
                    "arguments": _arguments(
                        function.get("arguments"), f"{where}.function.arguments"
                    ),
                },
            }
        )
    return calls


def conversation(raw: object, path: str = "messages") -> tuple[dict, ...]:
    """`messages` in the neutral form. An empty list is Ollama's "load the model"."""
    if not isinstance(raw, list):
        raise invalid_request(f"messages: expected an array, got {json_kind(raw)}", "messages")
    limit = settings.PANTHEON_MAX_MESSAGES
    if len(raw) > limit:
        raise invalid_request(
            f"messages: at most {limit} messages (PANTHEON_MAX_MESSAGES); got {len(raw)}",
            "messages",
        )
    out: list[dict] = []
    ids: list[str] = []  # every call id, in order
    names: dict[str, str] = {}  # call id -> function name
    answered: set[str] = set()
    for i, message in enumerate(raw):
        path = f"messages.{i}"
        if not isinstance(message, dict):
            raise invalid_request(f"{path}: expected an object, got {json_kind(message)}", path)
        role = message.get("role")
        if role not in MESSAGE_ROLES:
            raise invalid_request(
                f"{path}.role: expected one of {', '.join(MESSAGE_ROLES)}, got "
                f"{json.dumps(role)[:80]}",
                f"{path}.role",
            )
        content = MESSAGE.value(message, "content", f"{path}.") or ""
        refuse_images(message.get("images"), f"{path}.images")
        neutral: dict = {"role": role, "content": content}
        if role == "assistant":
            thinking = message.get("thinking")
            if thinking is not None and not isinstance(thinking, str):
                raise invalid_request(f"{path}.thinking: expected a string", f"{path}.thinking")
            if thinking:
                neutral["reasoning_content"] = thinking
            if message.get("tool_calls"):
                neutral["tool_calls"] = _tool_calls(
                    message["tool_calls"], f"{path}.tool_calls", ids
                )
                for call in neutral["tool_calls"]:
                    names[call["id"]] = call["function"]["name"]
        elif role == "tool":
            neutral["tool_call_id"] = _tool_result_id(message, path, ids, names, answered)
        out.append(neutral)
    if out and out[-1]["role"] == "assistant":
        last = f"messages.{len(out) - 1}"
        raise invalid_request(
            f"{last}: the last message is the assistant's: continuing it (prefill) is not "
            "supported here; end with a user or tool message",
            last,
        )
    return tuple(out)


def _tool_result_id(
    message: dict, path: str, ids: list[str], names: dict[str, str], answered: set[str]
) -> str:
    """The call a tool message answers: its `tool_call_id`, else the oldest unanswered
    call named `tool_name`, else the oldest unanswered call ("" when none)."""
    given = message.get("tool_call_id")
    if given is not None and not isinstance(given, str):
        raise invalid_request(f"{path}.tool_call_id: expected a string", f"{path}.tool_call_id")
    tool_name = message.get("tool_name")
    if tool_name is not None and not isinstance(tool_name, str):
        raise invalid_request(f"{path}.tool_name: expected a string", f"{path}.tool_name")
    open_calls = [i for i in ids if i not in answered]
    if given:
        chosen = given
    else:
        named = [i for i in open_calls if tool_name and names.get(i) == tool_name]
        chosen = (named or open_calls or [""])[0]
    if chosen:
        answered.add(chosen)
    return chosen


def tools(value: object, path: str = "tools") -> tuple[dict, ...]:
    """Ollama's tools are OpenAI function tools ({type: "function", function: {name,
    description, parameters}}); the core checks each one."""
    out = []
    for where, tool in tool_objects(value):
        if tool.get("type", "function") != "function":
            raise invalid_request(
                f'{where}.type: only "function" tools are supported', f"{where}.type"
            )
        if not isinstance(tool.get("function"), dict):
            raise invalid_request(f"{where}.function: expected an object", f"{where}.function")
        out.append({**tool, "type": "function"})
    return tuple(out)
