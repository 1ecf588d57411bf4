"""The OpenAPI piece of POST /v1/chat/completions (its request schema read from the
serializer: wire.openai_chat.request.ChatCompletionRequest). wire/openapi.py puts it
beside the meta routes' (wire/meta/openapi.py) and adds /chat/completions, the same
operation without /v1."""

from __future__ import annotations

from pantheon_platform.openapi import (
    BOOL,
    INT,
    JSON,
    NON_NEGATIVE,
    NUMBER,
    SSE,
    STRING,
    nullable,
    obj,
    operation,
    ref,
    serializer_schema,
    session_header,
    sse_event,
)
from pantheon_platform.strict_json import MAX_JSON_DEPTH
from wire.openai_chat.request import MESSAGE_ROLES, ChatCompletionRequest

_CHAT_MESSAGE = obj(
    {
        "role": {
            "type": "string",
            "enum": list(MESSAGE_ROLES),
            "description": "A missing role is read as `user`; `developer` as `system`. "
            "Any other role is a 400.",
        },
        "content": {
            "description": "A string, or an array of text parts ({type: text, text}). "
            "Another part (image_url, input_audio, file, ...) is a 400 naming it: no model "
            "here can take it. Any other type is read as empty.",
        },
        "name": STRING,
        "reasoning_content": {
            "type": "string",
            "description": "Assistant turns: the reasoning this server returned, replayed "
            "into the prompt.",
        },
        "tool_calls": {"type": "array", "items": {"type": "object"}},
        "tool_call_id": STRING,
    },
    additionalProperties=True,
)


_USAGE = obj(
    {
        "prompt_tokens": NON_NEGATIVE,
        "completion_tokens": NON_NEGATIVE,
        "total_tokens": NON_NEGATIVE,
        "prompt_tokens_details": obj({"cached_tokens": NON_NEGATIVE}, ("cached_tokens",)),
        "completion_tokens_details": obj(
            {
                "reasoning_tokens": NON_NEGATIVE,
                "accepted_prediction_tokens": {
                    **NON_NEGATIVE,
                    "description": "Tokens drafted from the request's `prediction` that "
                    "the model generated (present when the request sent one).",
                },
                "rejected_prediction_tokens": {
                    **NON_NEGATIVE,
                    "description": "Tokens drafted from the `prediction` that it did not.",
                },
            },
            ("reasoning_tokens",),
            description="There with reasoning tokens or a `prediction`.",
        ),
        "kv_used": NON_NEGATIVE,
        "kv_cap": NON_NEGATIVE,
        "session_conflict": BOOL,
        "truncated_messages": {
            **NON_NEGATIVE,
            "description": 'Messages `truncation: "auto"` dropped to fit (present when any).',
        },
    },
    (
        "prompt_tokens",
        "completion_tokens",
        "total_tokens",
        "prompt_tokens_details",
        "kv_used",
        "kv_cap",
    ),
)

_TOP_LOGPROB = obj(
    {"token": STRING, "logprob": NUMBER, "bytes": {"type": "array", "items": NON_NEGATIVE}},
    ("token", "logprob", "bytes"),
)
_LOGPROBS = obj(
    {
        "content": {
            "type": "array",
            "items": obj(
                {
                    **_TOP_LOGPROB["properties"],
                    "top_logprobs": {"type": "array", "items": _TOP_LOGPROB},
                },
                ("token", "logprob", "bytes", "top_logprobs"),
            ),
        }
    },
    ("content",),
)

_TOOL_CALL = obj(
    {
        "id": STRING,
        "type": {"const": "function"},
        "function": obj({"name": STRING, "arguments": STRING}, ("name", "arguments")),
    },
    ("id", "type", "function"),
)
# A call the model wrote that is not in the answer's calls (an unknown tool, malformed,
# cut short): the chat route's choice, and Anthropic's, Responses' and Ollama's answers.
TOOL_CALL_ERROR = obj(
    {"code": STRING, "message": STRING, "function": STRING, "parameter": STRING},
    ("code", "message"),
    description="A tool call the model wrote that was dropped: why (code: incomplete_call, "
    "malformed_call, unknown_function, invalid_argument).",
)

_FINISH_REASON = {"type": "string", "enum": ["stop", "length", "tool_calls", "repetition_loop"]}
_N_STATUS = {
    "type": "string",
    "enum": ["capped_to_8", "partial_slot_unavailable", "partial_generation_failed"],
}
_FORMAT_STATUS = {
    "type": "string",
    "enum": [
        "applied",
        "schema_downgraded",
        "ignored_tools_present",
        "ignored_unknown_type",
        "not_enforced",
    ],
}

_CHAT_COMPLETION = obj(
    {
        "id": STRING,
        "object": {"const": "chat.completion"},
        "created": INT,
        "model": STRING,
        "choices": {
            "type": "array",
            "items": obj(
                {
                    "index": NON_NEGATIVE,
                    "message": obj(
                        {
                            "role": {"const": "assistant"},
                            "content": nullable(STRING),
                            "reasoning_content": STRING,
                            "tool_calls": {"type": "array", "items": _TOOL_CALL},
                        },
                        ("role", "content"),
                    ),
                    "finish_reason": _FINISH_REASON,
                    "logprobs": _LOGPROBS,
                    "tool_call_error": TOOL_CALL_ERROR,
                },
                ("index", "message", "finish_reason"),
            ),
        },
        "usage": ref("Usage"),
        "n_status": _N_STATUS,
        "response_format_status": _FORMAT_STATUS,
        "response_format_message": STRING,
    },
    ("id", "object", "created", "model", "choices", "usage"),
)

_CHAT_STREAM = sse_event(
    "Server-sent events: `data: {chat.completion.chunk}` lines (a role chunk "
    "per choice, content/reasoning/tool-call deltas, a closing chunk with finish_reason, a "
    "usage chunk with stream_options.include_usage), then `data: [DONE]`. A "
    "context_over_budget found after the stream opened is a terminal `data: {error}` event."
)


def chat_request() -> dict:
    """POST /v1/chat/completions' body: the serializer's fields (their types, bounds,
    help_text); the counts of messages and tools are settings, read when asked."""
    return serializer_schema(
        ChatCompletionRequest,
        additionalProperties=True,
        description="Fields not listed are accepted and ignored. Arrays and objects nest at "
        f"most {MAX_JSON_DEPTH} levels deep.",
    )


def schemas() -> dict:
    return {
        "ChatMessage": _CHAT_MESSAGE,
        "ChatCompletion": _CHAT_COMPLETION,
        "ChatCompletionRequest": chat_request(),
        "Usage": _USAGE,
    }


def path_items() -> dict[str, dict]:
    """POST /v1/chat/completions' path item."""
    chat_ok = {
        "description": "A completion, or (stream: true) an event stream.",
        "content": {JSON: {"schema": ref("ChatCompletion")}, SSE: {"schema": _CHAT_STREAM}},
    }
    return {
        "/v1/chat/completions": {
            "post": operation(
                "/v1/chat/completions",
                "createChatCompletion",
                "OpenAI-compatible chat completion (JSON or SSE)",
                chat_ok,
                (400, 404, 429, 503),
                body=ref("ChatCompletionRequest"),
                parameters=[session_header()],
                tag="client",
            )
        },
    }
