"""An Anthropic Messages conversation (`system` and `messages`) in the neutral (OpenAI
chat) shape the chat core renders, and the schema of a message as the request table
shows it.

`system` becomes a system message; text blocks the content; `tool_use` blocks an
assistant's tool_calls; `tool_result` blocks tool messages; `thinking` blocks its
reasoning_content. Blocks no loaded model can read (images, documents) and an assistant
prefill are a 400 naming the field; `redacted_thinking` (opaque by design) is dropped.
"""

from __future__ import annotations

import json

from django.conf import settings

from pantheon_platform.errors import invalid_request
from pantheon_platform.strict_json import json_kind
from wire.fields import ANTHROPIC, Array, Boolean, Field, Shape, String, Table

# Blocks whose content no loaded model can take in (Anthropic's names).
UNSEEABLE_BLOCKS = ("image", "document", "search_result", "container_upload")

_STRING = String()
_OBJECT = Shape({"type": "object"})


def _member(name: str, kind, required: bool = False) -> Field:
    """A member of an object in a message (never null there)."""
    return Field(name, kind, required=required, nullable=False)


TEXT_BLOCK = Table(_member("type", Shape({"const": "text"}), True), _member("text", _STRING, True))
_TEXTS = Shape({"anyOf": [_STRING.schema(), Array(TEXT_BLOCK.schema()).schema()]})
BLOCK = Table(
    _member(
        "type",
        Shape(
            {
                "type": "string",
                "description": "user: text, tool_result; assistant: text, thinking, "
                "redacted_thinking (dropped), tool_use. "
                + ", ".join(UNSEEABLE_BLOCKS)
                + " blocks are a 400 naming the block: no model here can read them.",
            }
        ),
        True,
    ),
    _member("text", _STRING),
    _member("thinking", _STRING),
    _member("signature", _STRING),
    _member("id", _STRING),
    _member("name", _STRING),
    _member("input", _OBJECT),
    _member("tool_use_id", _STRING),
    _member("content", _TEXTS),
    _member("is_error", Boolean()),
)
MESSAGE = Table(
    _member("role", Shape({"enum": ["user", "assistant"]}), True),
    _member(
        "content",
        Shape(
            {"anyOf": [_STRING.schema(), Array(BLOCK.schema(additionalProperties=True)).schema()]}
        ),
        True,
    ),
    wording=ANTHROPIC,
)


def conversation(raw: object, system: object) -> tuple[dict, ...]:
    """`messages` (after `system`) as neutral messages."""
    if raw is None:
        raise invalid_request("messages: Field required", "messages")
    if not isinstance(raw, list):
        raise invalid_request(f"messages: expected an array, got {json_kind(raw)}", "messages")
    if not raw:
        raise invalid_request("messages: at least one message is required", "messages")
    limit = settings.PANTHEON_MAX_MESSAGES
    if len(raw) > limit:
        raise invalid_request(
            f"messages: at most {limit} messages (PANTHEON_MAX_MESSAGES); got {len(raw)}",
            "messages",
        )
    out = _system(system)
    for i, message in enumerate(raw):
        path = f"messages.{i}"
        if not isinstance(message, dict):
            raise invalid_request(f"{path}: expected an object, got {json_kind(message)}", path)
        role = message.get("role")
        if role == "user":
            out.extend(_user(message.get("content"), path))
        elif role == "assistant":
            if i == len(raw) - 1:
                raise invalid_request(
                    f"{path}: the last message must be the user's: continuing an assistant "
                    "message (prefill) is not supported",
                    path,
                )
            out.append(_assistant(message.get("content"), path))
        elif role == "system":
            raise invalid_request(
                f'{path}.role: "system" is not a message role here; send the system prompt '
                'as the top-level "system" field',
                f"{path}.role",
            )
        else:
            raise invalid_request(
                f'{path}.role: expected "user" or "assistant", got {json.dumps(role)}',
                f"{path}.role",
            )
    return tuple(out)


def _system(value: object) -> list[dict]:
    if value is None:
        return []
    if isinstance(value, str):
        return [{"role": "system", "content": value}] if value else []
    if not isinstance(value, list):
        raise invalid_request(
            f"system: expected a string or an array of text blocks, got {json_kind(value)}",
            "system",
        )
    texts = []
    for j, block in enumerate(value):
        path = f"system.{j}"
        if not isinstance(block, dict) or block.get("type") != "text":
            raise invalid_request(f'{path}: expected a text block ({{"type": "text"}})', path)
        texts.append(_text_of(block, path))
    text = "".join(texts)
    return [{"role": "system", "content": text}] if text else []


def _blocks(content: object, path: str) -> list[dict]:
    """A message's content as a list of blocks (a string is one text block)."""
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    if not isinstance(content, list):
        raise invalid_request(
            f"{path}.content: expected a string or an array of content blocks, "
            f"got {json_kind(content)}",
            f"{path}.content",
        )
    for j, block in enumerate(content):
        where = f"{path}.content.{j}"
        if not isinstance(block, dict):
            raise invalid_request(f"{where}: expected an object, got {json_kind(block)}", where)
        kind = block.get("type")
        if kind in UNSEEABLE_BLOCKS:
            raise invalid_request(
                f"{where}: {kind} blocks are not supported: no model this server runs can "
                f"read {kind}s; send text",
                where,
            )
        if not isinstance(kind, str):
            raise invalid_request(f"{where}.type: Field required", f"{where}.type")
    return content


def _text_of(block: dict, path: str) -> str:
    text = block.get("text")
    if not isinstance(text, str):
        raise invalid_request(f"{path}.text: expected a string", f"{path}.text")
    return text


def _user(content: object, path: str) -> list[dict]:
    """A user message: its tool_result blocks as tool messages (in order), then its text
    as one user message."""
    out: list[dict] = []
    texts: list[str] = []
    for j, block in enumerate(_blocks(content, path)):
        where = f"{path}.content.{j}"
        kind = block["type"]
        if kind == "text":
            texts.append(_text_of(block, where))
        elif kind == "tool_result":
            out.append(_tool_result(block, where))
        else:
            raise invalid_request(
                f"{where}.type: {json.dumps(kind)} is not a user content block here; "
                'expected "text" or "tool_result"',
                f"{where}.type",
            )
    if texts or not out:
        out.append({"role": "user", "content": "".join(texts)})
    return out


def _tool_result(block: dict, path: str) -> dict:
    call_id = block.get("tool_use_id")
    if not isinstance(call_id, str) or not call_id:
        raise invalid_request(f"{path}.tool_use_id: expected a string", f"{path}.tool_use_id")
    content = block.get("content")
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    elif isinstance(content, list):
        parts = []
        for k, part in enumerate(content):
            where = f"{path}.content.{k}"
            kind = part.get("type") if isinstance(part, dict) else None
            if kind in UNSEEABLE_BLOCKS:
                raise invalid_request(
                    f"{where}: {kind} blocks are not supported: no model this server runs "
                    f"can read {kind}s; send text",
                    where,
                )
            if kind != "text":
                raise invalid_request(f"{where}: expected a text block", where)
            parts.append(_text_of(part, where))
        text = "".join(parts)
    else:
        raise invalid_request(
            f"{path}.content: expected a string or an array of text blocks",
            f"{path}.content",
        )
    is_error = block.get("is_error")
    if is_error is not None and not isinstance(is_error, bool):
        raise invalid_request(f"{path}.is_error: expected a boolean", f"{path}.is_error")
    if is_error:
        # The model reads a failed call as such: the neutral tool message has no flag.
        text = f"Error: {text}" if text else "Error"
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def _assistant(content: object, path: str) -> dict:
    texts: list[str] = []
    thoughts: list[str] = []
    calls: list[dict] = []
    for j, block in enumerate(_blocks(content, path)):
        where = f"{path}.content.{j}"
        kind = block["type"]
        if kind == "text":
            texts.append(_text_of(block, where))
        elif kind == "thinking":
            thinking = block.get("thinking")
            if not isinstance(thinking, str):
                raise invalid_request(f"{where}.thinking: expected a string", f"{where}.thinking")
            thoughts.append(thinking)
        elif kind == "redacted_thinking":
            continue  # opaque by design: nothing a model here could read
        elif kind == "tool_use":
            calls.append(_tool_use(block, where))
        else:
            raise invalid_request(
                f"{where}.type: {json.dumps(kind)} is not an assistant content block here; "
                'expected "text", "thinking", "redacted_thinking" or "tool_use"',
                f"{where}.type",
            )
    message: dict = {"role": "assistant", "content": "".join(texts)}
    if thoughts:
        message["reasoning_content"] = "".join(thoughts)
    if calls:
        message["tool_calls"] = calls
    return message


def _tool_use(block: dict, path: str) -> dict:
    call_id, name, arguments = block.get("id"), block.get("name"), block.get("input")
    if not isinstance(call_id, str) or not call_id:
        raise invalid_request(f"{path}.id: expected a string", f"{path}.id")
    if not isinstance(name, str) or not name:
        raise invalid_request(f"{path}.name: expected a string", f"{path}.name")
    if not isinstance(arguments, dict):
        raise invalid_request(f"{path}.input: expected an object", f"{path}.input")
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": name, "arguments": json.dumps(arguments, ensure_ascii=False)},
    }
