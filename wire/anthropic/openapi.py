"""The OpenAPI pieces of the Anthropic Messages routes (wire/anthropic): POST
/v1/messages and POST /v1/messages/count_tokens. The bounds are the parser's
(wire/anthropic/request.py) and the settings it reads.

pantheon_site/openapi.py calls add_paths() with its paths and merges schemas()."""

from __future__ import annotations

from pantheon_platform.errors import ANTHROPIC_ERROR_TYPES as ERROR_TYPES
from pantheon_platform.openapi import (
    JSON,
    NON_NEGATIVE,
    RETRY_AFTER,
    SSE,
    STRING,
    nullable,
    obj,
    operation,
    ref,
    sse_event,
)
from pantheon_platform.strict_json import IDENTIFIER_MAX
from wire.anthropic.render import STOP_REASONS
from wire.anthropic.request import COUNT, REQUEST
from wire.openai_chat.openapi import TOOL_CALL_ERROR

MESSAGES_PATH = "/v1/messages"
COUNT_PATH = "/v1/messages/count_tokens"


def schemas() -> dict:
    """The request bodies are the parser's tables (wire/anthropic/request.py); the
    answers are typed here."""
    request = REQUEST.schema(
        additionalProperties=True,
        description="Anthropic's Messages request. Other fields are ignored, but for "
        "`thread` (message threads), refused with 400 and `error.details.error_code` "
        "`thread_unsupported_request`: send the whole conversation.",
    )
    count = COUNT.schema(additionalProperties=True)
    content_block = {
        "oneOf": [
            obj({"type": {"const": "text"}, "text": STRING}, ("type", "text")),
            obj(
                {"type": {"const": "thinking"}, "thinking": STRING, "signature": STRING},
                ("type", "thinking", "signature"),
            ),
            obj(
                {
                    "type": {"const": "tool_use"},
                    "id": STRING,
                    "name": STRING,
                    "input": {"type": "object"},
                },
                ("type", "id", "name", "input"),
            ),
        ]
    }
    usage = obj(
        {
            "input_tokens": NON_NEGATIVE,
            "output_tokens": NON_NEGATIVE,
            "cache_creation_input_tokens": NON_NEGATIVE,
            "cache_read_input_tokens": NON_NEGATIVE,
        },
        ("input_tokens", "output_tokens"),
        description="input_tokens: prompt tokens not read from the session cache; "
        "cache_read_input_tokens: those read from it.",
    )
    stop_reasons = sorted({*STOP_REASONS.values(), "stop_sequence"})
    return {
        "AnthropicMessagesRequest": request,
        "AnthropicCountTokensRequest": count,
        "AnthropicMessage": obj(
            {
                "id": STRING,
                "type": {"const": "message"},
                "role": {"const": "assistant"},
                "model": STRING,
                "content": {"type": "array", "items": content_block},
                "stop_reason": {"enum": [*stop_reasons, None]},
                "stop_sequence": nullable(STRING),
                "usage": usage,
                "tool_call_error": TOOL_CALL_ERROR,
            },
            ("id", "type", "role", "model", "content", "stop_reason", "usage"),
        ),
        "AnthropicTokenCount": obj({"input_tokens": NON_NEGATIVE}, ("input_tokens",)),
        "AnthropicError": obj(
            {
                "type": {"const": "error"},
                "error": obj(
                    {"type": {"enum": sorted(set(ERROR_TYPES.values()))}, "message": STRING},
                    ("type", "message"),
                ),
            },
            ("type", "error"),
        ),
    }


_STREAM = sse_event(
    "Server-sent events, each with its `event:` line: message_start, ping, "
    "then per content block content_block_start, content_block_delta (text_delta, "
    "thinking_delta, input_json_delta), content_block_stop; then message_delta "
    "(stop_reason, stop_sequence, usage) and message_stop. An error after the stream "
    "opened is an `event: error` in Anthropic's shape."
)


def _error(description: str, *, also_layers: bool = False) -> dict:
    schema = ref("AnthropicError")
    if also_layers:  # the ASGI layers before the route answer in the server's own shape
        schema = {"anyOf": [schema, ref("Error")]}
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _responses(ok: dict) -> dict:
    busy = _error(
        "rate_limit_error: the server is busy (queue full or timed out, prepare pool), the "
        "model's sessions are all held, or the session is busy; the key's concurrency "
        "limit (the server's shape). With Retry-After.",
        also_layers=True,
    )
    busy["headers"] = RETRY_AFTER
    overloaded = _error(
        "overloaded_error: no model loaded, memory pressure, or shutting down; the key "
        "table unreadable (the server's shape).",
        also_layers=True,
    )
    overloaded["headers"] = RETRY_AFTER
    return {
        "200": ok,
        "400": _error(
            "invalid_request_error: a malformed or invalid body (names the field), a block "
            'no model can read, or "prompt is too long: N tokens > M maximum".'
        ),
        "404": _error("not_found_error: `model` names no served model (with several)."),
        "413": _error(
            "request_too_large: over the body limit (the server's shape), or preparing it "
            "took too long.",
            also_layers=True,
        ),
        "429": busy,
        "500": _error("api_error (never a traceback)."),
        "503": overloaded,
    }


def add_paths(paths: dict[str, dict]) -> None:
    """Add the two Messages routes to `paths` (before openapi.py adds the layers' other
    errors and the preflights)."""
    for path, operation_id, summary, body, ok in (
        (
            MESSAGES_PATH,
            "anthropicMessages",
            "Anthropic Messages: a message, or (stream: true) its event stream",
            ref("AnthropicMessagesRequest"),
            {
                "description": "A message, or (stream: true) an event stream.",
                "content": {JSON: {"schema": ref("AnthropicMessage")}, SSE: {"schema": _STREAM}},
            },
        ),
        (
            COUNT_PATH,
            "anthropicCountTokens",
            "Anthropic token counting: the prompt's tokens, nothing generated",
            ref("AnthropicCountTokensRequest"),
            {
                "description": "The prompt's token count.",
                "content": {JSON: {"schema": ref("AnthropicTokenCount")}},
            },
        ),
    ):
        op = operation(path, operation_id, summary, ok, body=body, tag="anthropic")
        op["responses"] = _responses(ok)
        op["parameters"] = [
            {
                "name": "X-Session-Id",
                "in": "header",
                "required": False,
                "description": "The session id when the body gives none.",
                "schema": {"type": "string", "maxLength": IDENTIFIER_MAX},
            },
            {
                "name": "anthropic-version",
                "in": "header",
                "required": False,
                "description": "Accepted, any value (not required).",
                "schema": {"type": "string"},
            },
        ]
        paths[path] = {"post": op}
