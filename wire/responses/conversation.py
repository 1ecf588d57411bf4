"""A Responses request's `input` (a string, or a list of items) as chat messages, and the
schema of those items as the request table shows it.

Message items stay messages (developer -> system), function_call items join the
assistant turn they follow as tool_calls, function_call_output items become tool turns,
reasoning items the next assistant turn's reasoning_content. Every refusal is a 400
naming the item.
"""

from __future__ import annotations

from django.conf import settings

from pantheon_platform.errors import invalid_request
from pantheon_platform.strict_json import IDENTIFIER_MAX
from wire.fields import TEXT_MAX, AnyOf, Array, Field, Shape, String, Table

INPUT_ROLES = ("user", "system", "developer", "assistant")
TEXT_PARTS = ("input_text", "output_text", "text")
UNSEEN_PARTS = {
    "input_image": "images",
    "input_file": "files",
    "input_audio": "audio",
}

# Every text of the conversation (a message's content or part, a call's arguments, a
# tool's output, a reasoning text) is bounded by TEXT_MAX, whether or not the template
# renders it (one that does not render earlier calls would still store them).

_STRING = String(TEXT_MAX)
_CALL_ID = String(IDENTIFIER_MAX, min_length=1)


def _member(name: str, kind, required: bool = False, description: str | None = None) -> Field:
    """A member of an item (never null there)."""
    return Field(name, kind, required=required, nullable=False, description=description)


# A message's content: a string or text parts (input_text, output_text, refusal).
TEXTS = AnyOf(
    (
        _STRING,
        Array(
            Table(
                _member("type", Shape({"enum": [*TEXT_PARTS, "refusal"]}), True),
                _member("text", _STRING),
                _member("refusal", _STRING),
            ).schema(
                description="Text. input_image, input_file and input_audio parts are "
                "refused (400 naming the part): no loaded model reads them."
            )
        ),
    )
)
MESSAGE_ITEM = Table(
    _member("type", Shape({"const": "message"})),
    _member(
        "role",
        Shape({"enum": list(INPUT_ROLES)}),
        True,
        description="developer is read as system.",
    ),
    _member("content", TEXTS, True),
)
FUNCTION_CALL_ITEM = Table(
    _member("type", Shape({"const": "function_call"}), True),
    _member("call_id", _CALL_ID, True),
    _member("name", _CALL_ID, True),
    _member("arguments", _STRING, True, description="The arguments as JSON text."),
)
FUNCTION_OUTPUT_ITEM = Table(
    _member("type", Shape({"const": "function_call_output"}), True),
    _member("call_id", _CALL_ID, True),
    _member("output", TEXTS, True),
)
REASONING_ITEM = Table(
    _member("type", Shape({"const": "reasoning"}), True),
    _member(
        "content",
        Array(Table(_member("type", _STRING), _member("text", _STRING, True)).schema()),
    ),
)
ITEMS = AnyOf(
    (
        MESSAGE_ITEM.schema(),
        FUNCTION_CALL_ITEM.schema(),
        FUNCTION_OUTPUT_ITEM.schema(),
        REASONING_ITEM.schema(description="Its text becomes the next assistant turn's reasoning."),
    )
)


def input_messages(value: object, *, allow_empty: bool = False) -> list[dict]:
    """`input` (a string, or a list of items) as chat messages: message items as they
    are (developer -> system), function_call items joined into the assistant turn they
    follow as tool_calls, function_call_output items as tool turns, reasoning items as
    the next assistant turn's reasoning_content."""
    if isinstance(value, str):
        return [{"role": "user", "content": bounded_text(value, "input")}]
    if value is None:
        if allow_empty:
            return []
        raise invalid_request("input: required (a string or a list of items)", param="input")
    if not isinstance(value, list):
        raise invalid_request("input: expected a string or a list of items", param="input")
    limit = settings.PANTHEON_MAX_MESSAGES
    if len(value) > limit:
        raise invalid_request(
            f"input: at most {limit} items (PANTHEON_MAX_MESSAGES); got {len(value)}",
            param="input",
        )
    if not value and not allow_empty:
        raise invalid_request("input: expected at least one item", param="input")
    messages: list[dict] = []
    reasoning: list[str] = []  # reasoning items waiting for their assistant turn
    for i, item in enumerate(value):
        where = f"input[{i}]"
        if not isinstance(item, dict):
            raise invalid_request(f"{where}: expected an object", param=where)
        kind = item.get("type")
        if kind is None and "role" in item:
            kind = "message"
        if kind == "message":
            message = _message(item, where)
            if message["role"] == "assistant" and reasoning:
                message["reasoning_content"] = "".join(reasoning)
                reasoning = []
            messages.append(message)
        elif kind == "function_call":
            call = _function_call(item, where)
            last = messages[-1] if messages else None
            if last is not None and last["role"] == "assistant":
                last.setdefault("tool_calls", []).append(call)
                if reasoning:  # thought between the turn's text and this call
                    last["reasoning_content"] = last.get("reasoning_content", "") + "".join(
                        reasoning
                    )
                    reasoning = []
            else:
                message = {"role": "assistant", "content": "", "tool_calls": [call]}
                if reasoning:
                    message["reasoning_content"] = "".join(reasoning)
                    reasoning = []
                messages.append(message)
        elif kind == "function_call_output":
            messages.append(_function_call_output(item, where))
        elif kind == "reasoning":
            reasoning.append(_reasoning_text(item, where))
        elif kind == "item_reference":
            raise invalid_request(
                f"{where}: item_reference is not supported; send the item itself, or "
                "continue a stored response with previous_response_id",
                param=f"{where}.type",
            )
        elif isinstance(kind, str):
            raise invalid_request(
                f"{where}: items of type {kind!r} are not supported (message, "
                "function_call, function_call_output and reasoning are)",
                param=f"{where}.type",
            )
        else:
            raise invalid_request(
                f"{where}: expected an item with a `type` (or a message with a `role`)",
                param=where,
            )
    return messages


def _message(item: dict, where: str) -> dict:
    role = item.get("role")
    if role not in INPUT_ROLES:
        raise invalid_request(
            f"{where}.role: expected one of {', '.join(INPUT_ROLES)}", param=f"{where}.role"
        )
    content = item.get("content")
    if isinstance(content, str):
        text = bounded_text(content, f"{where}.content")
    elif isinstance(content, list):
        text = "".join(_part_text(part, f"{where}.content[{j}]") for j, part in enumerate(content))
    else:
        raise invalid_request(
            f"{where}.content: expected a string or a list of content parts",
            param=f"{where}.content",
        )
    return {"role": "system" if role == "developer" else role, "content": text}


def _part_text(part: object, where: str) -> str:
    if not isinstance(part, dict):
        raise invalid_request(f"{where}: expected a content part object", param=where)
    kind = part.get("type")
    if kind in UNSEEN_PARTS:
        raise invalid_request(
            f"{where}: {kind} parts are not supported: no loaded model can read "
            f"{UNSEEN_PARTS[kind]}; send text (input_text)",
            param=where,
        )
    if kind == "refusal":
        text = part.get("refusal")
    elif kind in TEXT_PARTS:
        text = part.get("text")
    else:
        raise invalid_request(
            f"{where}: unknown content part type {kind!r} (input_text and output_text "
            "are supported)",
            param=f"{where}.type",
        )
    if not isinstance(text, str):
        raise invalid_request(f"{where}.text: expected a string", param=f"{where}.text")
    return bounded_text(text, f"{where}.{'refusal' if kind == 'refusal' else 'text'}")


def _function_call(item: dict, where: str) -> dict:
    call_id = _item_str(item, "call_id", where)
    name = _item_str(item, "name", where)
    arguments = item.get("arguments")
    if not isinstance(arguments, str):
        raise invalid_request(
            f"{where}.arguments: expected a string (the arguments as JSON text)",
            param=f"{where}.arguments",
        )
    bounded_text(arguments, f"{where}.arguments")
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _function_call_output(item: dict, where: str) -> dict:
    call_id = _item_str(item, "call_id", where)
    output = item.get("output")
    if isinstance(output, list):
        output = "".join(_part_text(part, f"{where}.output[{j}]") for j, part in enumerate(output))
    elif not isinstance(output, str):
        raise invalid_request(
            f"{where}.output: expected a string or a list of content parts",
            param=f"{where}.output",
        )
    else:
        bounded_text(output, f"{where}.output")
    return {"role": "tool", "tool_call_id": call_id, "content": output}


def _reasoning_text(item: dict, where: str) -> str:
    """A reasoning item's text (its `content` reasoning_text parts); summaries and
    encrypted content are not the model's own words and are dropped."""
    content = item.get("content")
    if content is None:
        return ""
    if not isinstance(content, list):
        raise invalid_request(f"{where}.content: expected a list", param=f"{where}.content")
    texts = []
    for j, part in enumerate(content):
        text = part.get("text") if isinstance(part, dict) else None
        if not isinstance(text, str):
            raise invalid_request(
                f"{where}.content[{j}]: expected a reasoning_text part",
                param=f"{where}.content[{j}]",
            )
        texts.append(bounded_text(text, f"{where}.content[{j}].text"))
    return "".join(texts)


def bounded_text(text: str, where: str) -> str:
    """`text`, or a 400 naming `where` when it is longer than TEXT_MAX characters."""
    if len(text) > TEXT_MAX:
        raise invalid_request(f"{where}: at most {TEXT_MAX} characters", param=where)
    return text


def _item_str(item: dict, key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise invalid_request(f"{where}.{key}: expected a non-empty string", param=f"{where}.{key}")
    if len(value) > IDENTIFIER_MAX and key != "arguments":
        raise invalid_request(
            f"{where}.{key}: at most {IDENTIFIER_MAX} characters", param=f"{where}.{key}"
        )
    return value
