"""An Anthropic Messages request (POST /v1/messages, /v1/messages/count_tokens) into the
chat core's Turn.

Anthropic's shapes become the neutral (OpenAI chat) messages the core renders: `system`
a system message; text blocks the content; `tool_use` blocks an assistant's tool_calls;
`tool_result` blocks tool messages; `thinking` blocks its reasoning_content. What no
loaded model can honour (images, documents, server tools, an assistant prefill) is a 400
that names the field; nothing is silently dropped but `redacted_thinking` (opaque by
design) and `cache_control` (prefix caching is automatic; see the session id).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass

from django.conf import settings

from engine import (
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_K,
    DEFAULT_TOP_P,
    MAX_TOKENS_CLAMP,
    SamplingParams,
    Turn,
)
from pantheon_platform.errors import invalid_request
from pantheon_platform.strict_json import (
    IDENTIFIER_MAX,
    INT64_BOUND,
    MAX_STOP_STRINGS,
    json_kind,
    tool_objects,
)

# Blocks whose content no loaded model can take in (Anthropic's names).
UNSEEABLE_BLOCKS = ("image", "document", "search_result", "container_upload")
TOOL_CHOICES = ("auto", "any", "tool", "none")
THINKING_TYPES = ("enabled", "disabled", "adaptive")


@dataclass(frozen=True)
class MessagesRequest:
    """A validated Messages request: the turn fields plus what only the wire format uses."""

    model: str | None
    messages: tuple[dict, ...]
    tools: tuple[dict, ...]
    tool_choice: str | dict
    response_format: dict | None
    enable_thinking: bool | None
    reasoning_budget: int | None
    sampling: SamplingParams
    stream: bool
    session_id: str | None  # the client's id, before it is put in its key's namespace

    def turn(self, session_key: str | None) -> Turn:
        return Turn(
            messages=self.messages,
            tools=self.tools,
            tool_choice=self.tool_choice,
            response_format=self.response_format,
            enable_thinking=self.enable_thinking,
            reasoning_budget=self.reasoning_budget,
            sampling=self.sampling,
            session_id=session_key,
        )


def parse_messages_request(
    data: dict, *, count_only: bool = False, header_session: str | None = None
) -> MessagesRequest:
    """`data` (the body's JSON object) validated into a MessagesRequest; raises the 400
    ApiError naming the field. `count_only`: /v1/messages/count_tokens (no max_tokens,
    no sampling, no stream)."""
    model = _optional_string(data, "model", IDENTIFIER_MAX)
    messages = _conversation(data)
    tools = _tools(data.get("tools"))
    tool_choice = _tool_choice(data.get("tool_choice"), tools)
    enable_thinking, budget = _thinking(data.get("thinking"))
    response_format = _output_format(data.get("output_config"))
    if response_format is None and data.get("output_format") is not None:
        # The older spelling (a beta, still in the SDK's count_tokens).
        response_format = _json_schema_format(data["output_format"], "output_format")
    session_id = _optional_string(data, "session_id", IDENTIFIER_MAX) or header_session or None
    if session_id is not None and len(session_id) > IDENTIFIER_MAX:
        raise invalid_request(f"X-Session-Id: at most {IDENTIFIER_MAX} characters")
    if count_only:
        sampling = SamplingParams()
        stream = False
    else:
        sampling = _sampling(data)
        stream = _optional_bool(data, "stream") or False
        _metadata(data.get("metadata"))
    return MessagesRequest(
        model=model or None,
        messages=messages,
        tools=tools,
        tool_choice=tool_choice,
        response_format=response_format,
        enable_thinking=enable_thinking,
        reasoning_budget=budget,
        sampling=sampling,
        stream=stream,
        session_id=session_id,
    )


# --- scalars -------------------------------------------------------------------------


_kind = json_kind


def _optional_string(data: dict, key: str, max_length: int) -> str | None:
    value = data.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise invalid_request(f"{key}: expected a string, got {_kind(value)}", key)
    if len(value) > max_length:
        raise invalid_request(f"{key}: at most {max_length} characters", key)
    return value


def _optional_bool(data: dict, key: str) -> bool | None:
    value = data.get(key)
    if value is not None and not isinstance(value, bool):
        raise invalid_request(f"{key}: expected a boolean, got {_kind(value)}", key)
    return value


def _integer(value: object, path: str) -> int:
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid_request(f"{path}: expected an integer, got {_kind(value)}", path)
    if abs(value) >= INT64_BOUND:
        raise invalid_request(f"{path}: must be a 64-bit integer (|value| < 2**64)", path)
    return value


def _number(data: dict, key: str, low: float, high: float) -> float | None:
    value = data.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise invalid_request(f"{key}: expected a number, got {_kind(value)}", key)
    if isinstance(value, float) and not math.isfinite(value):
        raise invalid_request(f"{key}: expected a finite number", key)
    if not low <= value <= high:
        raise invalid_request(f"{key}: must be between {low:g} and {high:g}", key)
    return float(value)


def _sampling(data: dict) -> SamplingParams:
    if data.get("max_tokens") is None:
        raise invalid_request("max_tokens: Field required", "max_tokens")
    max_tokens = _integer(data["max_tokens"], "max_tokens")
    if max_tokens < 1:
        raise invalid_request("max_tokens: must be at least 1", "max_tokens")
    temperature = _number(data, "temperature", 0.0, 1.0)
    top_p = _number(data, "top_p", 0.0, 1.0)
    top_k = None
    if data.get("top_k") is not None:
        top_k = _integer(data["top_k"], "top_k")
        if not 0 <= top_k < 1 << 31:
            raise invalid_request("top_k: must be between 0 and 2**31 - 1", "top_k")
    seed = _integer(data["seed"], "seed") if data.get("seed") is not None else None
    return SamplingParams(
        temperature=DEFAULT_TEMPERATURE if temperature is None else temperature,
        top_k=DEFAULT_TOP_K if top_k is None else top_k,
        top_p=DEFAULT_TOP_P if top_p is None else top_p,
        max_tokens=min(max_tokens, MAX_TOKENS_CLAMP),
        stop=_stop_sequences(data.get("stop_sequences")),
        seed=seed,
    )


def _stop_sequences(value: object) -> tuple[str, ...]:
    if value is None:
        return ()
    if not isinstance(value, list) or not all(isinstance(s, str) for s in value):
        raise invalid_request("stop_sequences: expected an array of strings", "stop_sequences")
    if len(value) > MAX_STOP_STRINGS:
        raise invalid_request(
            f"stop_sequences: at most {MAX_STOP_STRINGS} sequences", "stop_sequences"
        )
    if any(len(s) > IDENTIFIER_MAX for s in value):
        raise invalid_request(
            f"stop_sequences: a sequence may have at most {IDENTIFIER_MAX} characters",
            "stop_sequences",
        )
    return tuple(s for s in value if s)


def _metadata(value: object) -> None:
    """`metadata.user_id` (an opaque id Anthropic uses against abuse) is accepted and
    not used: the session id, not the user, keys the prefix cache."""
    if value is None:
        return
    if not isinstance(value, dict):
        raise invalid_request(f"metadata: expected an object, got {_kind(value)}", "metadata")
    user_id = value.get("user_id")
    if user_id is not None and not isinstance(user_id, str):
        raise invalid_request("metadata.user_id: expected a string", "metadata.user_id")
    if isinstance(user_id, str) and len(user_id) > IDENTIFIER_MAX:
        raise invalid_request(
            f"metadata.user_id: at most {IDENTIFIER_MAX} characters", "metadata.user_id"
        )


def _thinking(value: object) -> tuple[bool | None, int | None]:
    """(enable_thinking, reasoning_budget): absent -> the server's defaults (as the chat
    route); `enabled` with `budget_tokens` -> thinking within that budget; `adaptive` ->
    thinking within the model's budget; `disabled` -> no thinking."""
    if value is None:
        return None, None
    if not isinstance(value, dict):
        raise invalid_request(f"thinking: expected an object, got {_kind(value)}", "thinking")
    kind = value.get("type")
    if kind not in THINKING_TYPES:
        raise invalid_request(
            f"thinking.type: expected one of {', '.join(THINKING_TYPES)}", "thinking.type"
        )
    if kind == "disabled":
        return False, None
    if kind == "adaptive":
        return True, None
    if value.get("budget_tokens") is None:
        raise invalid_request("thinking.budget_tokens: Field required", "thinking.budget_tokens")
    budget = _integer(value["budget_tokens"], "thinking.budget_tokens")
    if budget < 1:
        raise invalid_request(
            "thinking.budget_tokens: must be at least 1", "thinking.budget_tokens"
        )
    return True, budget


def _output_format(value: object) -> dict | None:
    """`output_config.format` (structured outputs: a JSON schema) as the core's
    response_format; `output_config.effort` is accepted and not used."""
    if value is None:
        return None
    if not isinstance(value, dict):
        raise invalid_request(
            f"output_config: expected an object, got {_kind(value)}", "output_config"
        )
    fmt = value.get("format")
    if fmt is None:
        return None
    return _json_schema_format(fmt, "output_config.format")


def _json_schema_format(fmt: object, path: str) -> dict:
    if not isinstance(fmt, dict) or fmt.get("type") != "json_schema":
        raise invalid_request(f'{path}: expected {{"type": "json_schema", "schema": ...}}', path)
    schema = fmt.get("schema")
    if not isinstance(schema, dict):
        raise invalid_request(f"{path}.schema: expected an object", f"{path}.schema")
    return {
        "type": "json_schema",
        "json_schema": {"name": "output", "schema": schema, "strict": True},
    }


# --- the conversation ----------------------------------------------------------------


def _conversation(data: dict) -> tuple[dict, ...]:
    raw = data.get("messages")
    if raw is None:
        raise invalid_request("messages: Field required", "messages")
    if not isinstance(raw, list):
        raise invalid_request(f"messages: expected an array, got {_kind(raw)}", "messages")
    if not raw:
        raise invalid_request("messages: at least one message is required", "messages")
    limit = settings.PANTHEON_MAX_MESSAGES
    if len(raw) > limit:
        raise invalid_request(
            f"messages: at most {limit} messages (PANTHEON_MAX_MESSAGES); got {len(raw)}",
            "messages",
        )
    out = _system(data.get("system"))
    for i, message in enumerate(raw):
        path = f"messages.{i}"
        if not isinstance(message, dict):
            raise invalid_request(f"{path}: expected an object, got {_kind(message)}", path)
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
            f"system: expected a string or an array of text blocks, got {_kind(value)}",
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
            f"got {_kind(content)}",
            f"{path}.content",
        )
    for j, block in enumerate(content):
        where = f"{path}.content.{j}"
        if not isinstance(block, dict):
            raise invalid_request(f"{where}: expected an object, got {_kind(block)}", where)
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


# --- tools ---------------------------------------------------------------------------


def _tools(value: object) -> tuple[dict, ...]:
    """Custom (client) tools as OpenAI function tools. Anthropic's server tools (web
    search, code execution, bash, ...) run on Anthropic's side: refused."""
    out = []
    for path, tool in tool_objects(value):
        kind = tool.get("type")
        if kind not in (None, "custom"):
            raise invalid_request(
                f"{path}.type: {json.dumps(kind)} is not supported: only custom tools "
                "(name, description, input_schema) run here, none of Anthropic's server tools",
                f"{path}.type",
            )
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise invalid_request(f"{path}.name: expected a string", f"{path}.name")
        schema = tool.get("input_schema")
        if not isinstance(schema, dict):
            raise invalid_request(
                f"{path}.input_schema: expected a JSON schema object", f"{path}.input_schema"
            )
        function: dict = {"name": name, "parameters": schema}
        description = tool.get("description")
        if description is not None:
            if not isinstance(description, str):
                raise invalid_request(
                    f"{path}.description: expected a string", f"{path}.description"
                )
            function["description"] = description
        out.append({"type": "function", "function": function})
    return tuple(out)


def _tool_choice(value: object, tools: tuple[dict, ...]) -> str | dict:
    """auto -> "auto", any -> "required", tool -> that function, none -> "none"."""
    if value is None:
        return "auto"
    if not isinstance(value, dict) or value.get("type") not in TOOL_CHOICES:
        raise invalid_request(
            'tool_choice: expected {"type": "auto" | "any" | "tool" | "none"}', "tool_choice"
        )
    parallel = value.get("disable_parallel_tool_use")
    if parallel is not None and not isinstance(parallel, bool):
        raise invalid_request(
            "tool_choice.disable_parallel_tool_use: expected a boolean",
            "tool_choice.disable_parallel_tool_use",
        )
    kind = value["type"]
    if kind in ("any", "tool") and not tools:
        raise invalid_request(
            f'tool_choice: "{kind}" needs `tools` (none were offered)', "tool_choice"
        )
    if kind == "any":
        return "required"
    if kind == "tool":
        name = value.get("name")
        if not isinstance(name, str) or name not in {t["function"]["name"] for t in tools}:
            raise invalid_request(
                "tool_choice.name: expected the name of a tool in `tools`", "tool_choice.name"
            )
        return {"type": "function", "function": {"name": name}}
    return kind
