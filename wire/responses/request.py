"""POST /v1/responses: the request's JSON checked and turned into chat-core terms.

The Responses shapes map onto the neutral chat shape (engine.chat.Turn):
`input` items become messages (function_call items an assistant turn's tool_calls,
function_call_output items tool turns), `instructions` a leading system message, flat
function tools the chat tool shape, `text.format` a response_format, `reasoning.effort`
thinking on or off with a reasoning budget. Every refusal is a 400 naming the field.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from django.conf import settings

from engine import (
    DEFAULT_MAX_TOKENS,
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_K,
    DEFAULT_TOP_P,
    MAX_TOKENS_CLAMP,
    SamplingParams,
)
from pantheon_platform.errors import invalid_request
from pantheon_platform.strict_json import IDENTIFIER_MAX, INT64_BOUND

# reasoning.effort -> (thinking on?, reasoning budget in tokens; 0: no budget). "none" and
# "minimal" turn thinking off; the others bound the think block, "max" not at all.
EFFORT_BUDGETS: dict[str, tuple[bool, int]] = {
    "none": (False, 0),
    "minimal": (False, 0),
    "low": (True, 512),
    "medium": (True, 2048),
    "high": (True, 8192),
    "xhigh": (True, 16384),
    "max": (True, 0),
}
TEMPERATURE_MAX = 2.0  # OpenAI's range for this route: [0, 2]
METADATA_MAX_PAIRS = 16
METADATA_KEY_MAX = 64
METADATA_VALUE_MAX = 512
INPUT_ROLES = ("user", "system", "developer", "assistant")
TEXT_PARTS = ("input_text", "output_text", "text")
UNSEEN_PARTS = {
    "input_image": "images",
    "input_file": "files",
    "input_audio": "audio",
}
# Accepted and not acted on: they change nothing a local model does.
IGNORED = (
    "include",
    "truncation",
    "user",
    "safety_identifier",
    "service_tier",
    "stream_options",
    "prompt_cache_retention",
    "max_tool_calls",
)
REFUSED = {
    "background": "background responses are not supported; send the request without it",
    "conversation": "conversations are not supported; continue with previous_response_id",
    "prompt": "prompt templates are not supported; send `input` and `instructions`",
}


@dataclass(frozen=True)
class ResponsesRequest:
    """A checked POST /v1/responses body, in chat-core terms plus what the response
    object echoes back."""

    model: str | None
    input_messages: tuple[dict, ...]  # this request's input, as chat messages
    instructions: str | None
    tools: tuple[dict, ...]  # chat shape, for the core
    tools_echo: tuple[dict, ...]  # Responses shape, for the response object
    tool_choice: str | dict  # chat shape
    tool_choice_echo: str | dict  # Responses shape
    response_format: dict | None
    text_echo: dict
    enable_thinking: bool | None
    reasoning_budget: int | None
    reasoning_echo: dict
    temperature: float
    top_p: float
    max_output_tokens: int | None
    seed: int | None
    store: bool
    stream: bool
    previous_response_id: str | None
    metadata: dict
    parallel_tool_calls: bool
    session_id: str | None  # prompt_cache_key (or the session_id extension)
    top_logprobs: int = 0

    def sampling(self) -> SamplingParams:
        max_tokens = DEFAULT_MAX_TOKENS
        if self.max_output_tokens is not None:
            max_tokens = min(self.max_output_tokens, MAX_TOKENS_CLAMP)
        return SamplingParams(
            temperature=self.temperature,
            top_k=DEFAULT_TOP_K,
            top_p=self.top_p,
            max_tokens=max_tokens,
            seed=self.seed,
            logprobs=self.top_logprobs > 0,
            top_logprobs=self.top_logprobs,
        )


def parse_request(body: dict) -> ResponsesRequest:
    """The checked request, or a 400 (invalid_request_error) naming the field."""
    for name, why in REFUSED.items():
        if body.get(name) not in (None, False):
            raise invalid_request(f"{name}: {why}", param=name)
    model = _optional_str(body, "model", IDENTIFIER_MAX) or None
    instructions = _optional_str(body, "instructions")
    tools_echo, tools = _tools(body.get("tools"))
    tool_choice_echo, tool_choice = _tool_choice(body.get("tool_choice"), tools_echo)
    text_echo, response_format = _text(body.get("text"))
    reasoning_echo, enable_thinking, budget = _reasoning(body.get("reasoning"))
    temperature = _number(body, "temperature", 0.0, TEMPERATURE_MAX)
    top_p = _number(body, "top_p", 0.0, 1.0)
    max_output_tokens = _integer(body, "max_output_tokens", 1)
    top_logprobs = _integer(body, "top_logprobs", 0, 20)
    previous = _optional_str(body, "previous_response_id", IDENTIFIER_MAX)
    session_id = _optional_str(body, "prompt_cache_key", IDENTIFIER_MAX) or _optional_str(
        body, "session_id", IDENTIFIER_MAX
    )
    messages = input_messages(body.get("input"), allow_empty=bool(previous))
    return ResponsesRequest(
        model=model,
        input_messages=tuple(messages),
        instructions=instructions,
        tools=tuple(tools),
        tools_echo=tuple(tools_echo),
        tool_choice=tool_choice,
        tool_choice_echo=tool_choice_echo,
        response_format=response_format,
        text_echo=text_echo,
        enable_thinking=enable_thinking,
        reasoning_budget=budget,
        reasoning_echo=reasoning_echo,
        temperature=DEFAULT_TEMPERATURE if temperature is None else temperature,
        top_p=DEFAULT_TOP_P if top_p is None else top_p,
        max_output_tokens=max_output_tokens,
        seed=_integer(body, "seed"),
        store=_bool(body, "store", True),
        stream=_bool(body, "stream", False),
        previous_response_id=previous or None,
        metadata=_metadata(body.get("metadata")),
        parallel_tool_calls=_bool(body, "parallel_tool_calls", True),
        session_id=session_id or None,
        top_logprobs=top_logprobs or 0,
    )


# --- input ---------------------------------------------------------------------------


def input_messages(value: object, *, allow_empty: bool = False) -> list[dict]:
    """`input` (a string, or a list of items) as chat messages: message items as they
    are (developer -> system), function_call items joined into the assistant turn they
    follow as tool_calls, function_call_output items as tool turns, reasoning items as
    the next assistant turn's reasoning_content."""
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
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
        text = content
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
    return text


def _function_call(item: dict, where: str) -> dict:
    call_id = _item_str(item, "call_id", where)
    name = _item_str(item, "name", where)
    arguments = item.get("arguments")
    if not isinstance(arguments, str):
        raise invalid_request(
            f"{where}.arguments: expected a string (the arguments as JSON text)",
            param=f"{where}.arguments",
        )
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
        texts.append(text)
    return "".join(texts)


def _item_str(item: dict, key: str, where: str) -> str:
    value = item.get(key)
    if not isinstance(value, str) or not value:
        raise invalid_request(f"{where}.{key}: expected a non-empty string", param=f"{where}.{key}")
    if len(value) > IDENTIFIER_MAX and key != "arguments":
        raise invalid_request(
            f"{where}.{key}: at most {IDENTIFIER_MAX} characters", param=f"{where}.{key}"
        )
    return value


# --- tools -----------------------------------------------------------------------------


def _tools(value: object) -> tuple[list[dict], list[dict]]:
    """(the tools as the response echoes them, the tools in the chat shape)."""
    if value is None:
        return [], []
    if not isinstance(value, list):
        raise invalid_request("tools: expected a list of tools", param="tools")
    limit = settings.PANTHEON_MAX_TOOLS
    if len(value) > limit:
        raise invalid_request(
            f"tools: at most {limit} tools (PANTHEON_MAX_TOOLS); got {len(value)}", param="tools"
        )
    echo, chat = [], []
    for i, tool in enumerate(value):
        where = f"tools[{i}]"
        if not isinstance(tool, dict):
            raise invalid_request(f"{where}: expected an object", param=where)
        kind = tool.get("type")
        if kind != "function":
            raise invalid_request(
                f"{where}.type: {kind!r} tools are not supported; only function tools "
                "(the caller runs them) are",
                param=f"{where}.type",
            )
        name = tool.get("name")
        if not isinstance(name, str) or not name:
            raise invalid_request(
                f"{where}.name: expected a non-empty string", param=f"{where}.name"
            )
        description = tool.get("description")
        if description is not None and not isinstance(description, str):
            raise invalid_request(
                f"{where}.description: expected a string", param=f"{where}.description"
            )
        parameters = tool.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise invalid_request(
                f"{where}.parameters: expected a JSON schema object", param=f"{where}.parameters"
            )
        strict = tool.get("strict")
        if strict is not None and not isinstance(strict, bool):
            raise invalid_request(f"{where}.strict: expected a boolean", param=f"{where}.strict")
        function: dict = {"name": name}
        if description is not None:
            function["description"] = description
        function["parameters"] = parameters if parameters is not None else {"type": "object"}
        if strict is not None:
            function["strict"] = strict
        chat.append({"type": "function", "function": function})
        echo.append(
            {
                "type": "function",
                "name": name,
                "description": description,
                "parameters": parameters,
                "strict": True if strict is None else strict,
            }
        )
    return echo, chat


def _tool_choice(value: object, tools: list[dict]) -> tuple[str | dict, str | dict]:
    """(tool_choice as the response echoes it, in the chat shape)."""
    if value is None:
        return "auto", "auto"
    if isinstance(value, str):
        if value not in ("auto", "none", "required"):
            raise invalid_request(
                'tool_choice: expected "auto", "none", "required" or '
                '{"type": "function", "name": ...}',
                param="tool_choice",
            )
        if value == "required" and not tools:
            raise invalid_request(
                'tool_choice: "required" needs `tools` to call; none were given',
                param="tool_choice",
            )
        return value, value
    if not isinstance(value, dict):
        raise invalid_request("tool_choice: expected a string or an object", param="tool_choice")
    kind = value.get("type")
    if kind != "function":
        raise invalid_request(
            f"tool_choice.type: {kind!r} is not supported; name a function "
            '({"type": "function", "name": ...}) or use "auto", "none", "required"',
            param="tool_choice.type",
        )
    name = value.get("name")
    if not isinstance(name, str) or name not in {t["name"] for t in tools}:
        raise invalid_request(
            "tool_choice.name: expected the name of a function in `tools`",
            param="tool_choice.name",
        )
    return {"type": "function", "name": name}, {"type": "function", "function": {"name": name}}


# --- text, reasoning ------------------------------------------------------------------


def _text(value: object) -> tuple[dict, dict | None]:
    """(text as the response echoes it, the chat response_format or None)."""
    if value is None:
        return {"format": {"type": "text"}}, None
    if not isinstance(value, dict):
        raise invalid_request("text: expected an object", param="text")
    verbosity = value.get("verbosity")
    if verbosity is not None and verbosity not in ("low", "medium", "high"):
        raise invalid_request(
            'text.verbosity: expected "low", "medium" or "high"', param="text.verbosity"
        )
    fmt = value.get("format")
    echo: dict = {}
    if verbosity is not None:
        echo["verbosity"] = verbosity
    if fmt is None:
        echo["format"] = {"type": "text"}
        return echo, None
    if not isinstance(fmt, dict):
        raise invalid_request("text.format: expected an object", param="text.format")
    kind = fmt.get("type")
    if kind == "text":
        echo["format"] = {"type": "text"}
        return echo, None
    if kind == "json_object":
        echo["format"] = {"type": "json_object"}
        return echo, {"type": "json_object"}
    if kind != "json_schema":
        raise invalid_request(
            'text.format.type: expected "text", "json_object" or "json_schema"',
            param="text.format.type",
        )
    name = fmt.get("name")
    if not isinstance(name, str) or not name or len(name) > 64:
        raise invalid_request(
            "text.format.name: expected a non-empty string (at most 64 characters)",
            param="text.format.name",
        )
    schema = fmt.get("schema")
    if not isinstance(schema, dict):
        raise invalid_request(
            "text.format.schema: expected a JSON schema object", param="text.format.schema"
        )
    strict = fmt.get("strict")
    if strict is not None and not isinstance(strict, bool):
        raise invalid_request("text.format.strict: expected a boolean", param="text.format.strict")
    description = fmt.get("description")
    if description is not None and not isinstance(description, str):
        raise invalid_request(
            "text.format.description: expected a string", param="text.format.description"
        )
    json_schema: dict = {"name": name, "schema": schema}
    if strict is not None:
        json_schema["strict"] = strict
    if description is not None:
        json_schema["description"] = description
    echo["format"] = {"type": "json_schema", **json_schema}
    return echo, {"type": "json_schema", "json_schema": json_schema}


def _reasoning(value: object) -> tuple[dict, bool | None, int | None]:
    """(reasoning as the response echoes it, enable_thinking, reasoning budget): None
    leaves each to the server's default."""
    if value is None:
        return {"effort": None, "summary": None}, None, None
    if not isinstance(value, dict):
        raise invalid_request("reasoning: expected an object", param="reasoning")
    effort = value.get("effort")
    summary = value.get("summary")
    if summary is not None and summary not in ("auto", "concise", "detailed"):
        raise invalid_request(
            'reasoning.summary: expected "auto", "concise" or "detailed"',
            param="reasoning.summary",
        )
    echo = {"effort": effort, "summary": summary}
    if effort is None:
        return echo, None, None
    if effort not in EFFORT_BUDGETS:
        raise invalid_request(
            f"reasoning.effort: expected one of {', '.join(EFFORT_BUDGETS)}",
            param="reasoning.effort",
        )
    thinking, budget = EFFORT_BUDGETS[effort]
    return echo, thinking, budget if thinking else None


# --- scalars ---------------------------------------------------------------------------


def _optional_str(body: dict, key: str, max_length: int | None = None) -> str | None:
    value = body.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise invalid_request(f"{key}: expected a string", param=key)
    if max_length is not None and len(value) > max_length:
        raise invalid_request(f"{key}: at most {max_length} characters", param=key)
    return value


def _bool(body: dict, key: str, default: bool) -> bool:
    value = body.get(key)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise invalid_request(f"{key}: expected a boolean", param=key)
    return value


def _number(body: dict, key: str, low: float, high: float) -> float | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise invalid_request(f"{key}: expected a number", param=key)
    if isinstance(value, int) and abs(value) >= INT64_BOUND:
        raise invalid_request(f"{key}: expected a number in [{low:g}, {high:g}]", param=key)
    value = float(value)
    if not math.isfinite(value) or not low <= value <= high:
        raise invalid_request(f"{key}: expected a number in [{low:g}, {high:g}]", param=key)
    return value


def _integer(body: dict, key: str, low: int | None = None, high: int | None = None) -> int | None:
    value = body.get(key)
    if value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int):
        raise invalid_request(f"{key}: expected an integer", param=key)
    if abs(value) >= INT64_BOUND:
        raise invalid_request(f"{key}: must be a 64-bit integer (|value| < 2**64)", param=key)
    if low is not None and value < low:
        raise invalid_request(f"{key}: must be at least {low}", param=key)
    if high is not None and value > high:
        raise invalid_request(f"{key}: must be at most {high}", param=key)
    return value


def _metadata(value: object) -> dict:
    """OpenAI's metadata: at most 16 string pairs, keys up to 64 characters, values 512."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise invalid_request("metadata: expected an object of strings", param="metadata")
    if len(value) > METADATA_MAX_PAIRS:
        raise invalid_request(
            f"metadata: at most {METADATA_MAX_PAIRS} pairs; got {len(value)}", param="metadata"
        )
    for key, item in value.items():
        if len(key) > METADATA_KEY_MAX:
            raise invalid_request(
                f"metadata: keys have at most {METADATA_KEY_MAX} characters", param="metadata"
            )
        if not isinstance(item, str) or len(item) > METADATA_VALUE_MAX:
            raise invalid_request(
                f"metadata.{key}: expected a string of at most {METADATA_VALUE_MAX} characters",
                param=f"metadata.{key}",
            )
    return dict(value)
