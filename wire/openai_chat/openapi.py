"""The OpenAPI pieces of the inference app's own routes (pantheon_site/openapi.py puts
the document together): GET /, GET /v1/models and /v1/models/{model_id},
POST /v1/chat/completions (its request schema read from the serializer:
wire.openai_chat.request.ChatCompletionRequest), llama.cpp's GET /health, the spellings
without /v1 that some clients use (/models, /models/{model_id}, /chat/completions: the
same operations), and the debug route when PANTHEON_DEBUG_ROUTES is on.

The Anthropic Messages routes are wire/anthropic/openapi.py."""

from __future__ import annotations

import copy

from pantheon_platform.openapi import (
    ATTENTION,
    BOOL,
    GRAPHS,
    INT,
    JSON,
    LOAD_PROGRESS,
    METHODS,
    NON_NEGATIVE,
    NUMBER,
    SSE,
    STRING,
    nullable,
    obj,
    ok,
    operation,
    ref,
    serializer_schema,
    session_header,
    sse_event,
)
from pantheon_platform.strict_json import MAX_JSON_DEPTH
from wire.openai_chat.request import MESSAGE_ROLES, ChatCompletionRequest

DEBUG_PATH = "/admin/debug/simulate-memory-pressure"
# The spellings without /v1: each documents the same operation as its /v1 route.
NO_V1_ALIASES = {
    "/models": "/v1/models",
    "/models/{model_id}": "/v1/models/{model_id}",
    "/chat/completions": "/v1/chat/completions",
}

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
        "completion_tokens_details": obj({"reasoning_tokens": NON_NEGATIVE}, ("reasoning_tokens",)),
        "kv_used": NON_NEGATIVE,
        "kv_cap": NON_NEGATIVE,
        "session_conflict": BOOL,
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
_TOOL_CALL_ERROR = obj(
    {"code": STRING, "message": STRING, "function": STRING, "parameter": STRING},
    ("code", "message"),
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
                    "tool_call_error": _TOOL_CALL_ERROR,
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

_MODEL_ENTRY = obj(
    {
        "id": STRING,
        "object": {"const": "model"},
        "created": INT,
        "owned_by": STRING,
        "max_sessions": NON_NEGATIVE,
        "max_concurrent": NON_NEGATIVE,
        "context_window": {
            "type": "integer",
            "minimum": 1,
            "description": "The effective window (usage.kv_cap); omitted when unknown.",
        },
        "tool_choice_required_with_thinking": BOOL,
        "graphs": GRAPHS,
        "attention": ATTENTION,
    },
    ("id", "object", "created", "owned_by", "max_sessions", "max_concurrent"),
)

_HEALTH = obj(
    {
        "service": {"const": "pantheon"},
        "status": {"const": "ok"},
        "backend": {"type": "string", "description": "cpu or cuda"},
        "kernel": {
            "type": "string",
            "enum": ["cpu", "numpy", "cuda"],
            "description": "cpu: compiled kernels on the GGUF blocks; numpy: the float32 "
            "reference (also when the kernels could not be built); cuda: the GPU backend "
            "(PANTHEON_BACKEND=cuda)",
        },
        "kernel_isa": {"type": "string", "description": "avx512, avx2 or generic (cpu only)"},
        "kernel_activations": {
            "type": "string",
            "enum": ["float32", "bfloat16"],
            "description": "what the decode products round activations to (cpu only; "
            "bfloat16 is opt-in: PANTHEON_ACTIVATIONS)",
        },
        "build": {"type": "string", "description": "git commit, -dirty, or unknown"},
        "accelerator": BOOL,
        "dies_visible": NON_NEGATIVE,
        "models": {
            "type": "object",
            "additionalProperties": {
                "type": "string",
                "enum": ["loading", "loaded", "unloading", "failed"],
            },
        },
        "load_errors": {"type": "object", "additionalProperties": STRING},
        "progress": {
            "type": "object",
            "description": "While models load: each one's progress.",
            "additionalProperties": LOAD_PROGRESS,
        },
    },
    ("service", "status", "backend", "kernel", "build", "accelerator", "dies_visible", "models"),
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
        "Health": _HEALTH,
        "ModelList": obj(
            {
                "object": {"const": "list"},
                "backend": STRING,
                "build": STRING,
                "data": {"type": "array", "items": _MODEL_ENTRY},
            },
            ("object", "backend", "build", "data"),
        ),
        "Model": _MODEL_ENTRY,
        "LlamaHealth": obj({"status": {"const": "ok"}}, ("status",)),
    }


def add_paths(paths: dict[str, dict]) -> None:
    """Add the routes of wire/urls.py (but the text API's, Ollama's and Anthropic's,
    which have their own pieces) to `paths`."""
    chat_ok = {
        "description": "A completion, or (stream: true) an event stream.",
        "content": {JSON: {"schema": ref("ChatCompletion")}, SSE: {"schema": _CHAT_STREAM}},
    }
    paths.update(
        {
            "/": {
                "get": operation(
                    "/",
                    "health",
                    "Health: backend, build, each model's state",
                    ok(ref("Health")),
                    tag="client",
                )
            },
            "/v1/models": {
                "get": operation(
                    "/v1/models",
                    "listModels",
                    "The served models",
                    ok(ref("ModelList")),
                    tag="client",
                )
            },
            "/v1/chat/completions": {
                "post": operation(
                    "/v1/chat/completions",
                    "createChatCompletion",
                    "OpenAI-compatible chat completion (JSON or SSE)",
                    chat_ok,
                    (400, 404, 422, 429, 503),
                    body=ref("ChatCompletionRequest"),
                    parameters=[session_header()],
                    tag="client",
                )
            },
        }
    )
    paths["/health"] = {
        "get": operation(
            "/health",
            "llamaHealth",
            "Readiness, as llama.cpp's /health: 200 {status: ok} once a model is loaded "
            "and none is loading; 503 in llama.cpp's shape ({error: {code: 503, message, "
            'type: "unavailable_error"}}) while the server starts or a model loads '
            '("Loading model"), with nothing loaded ("No model loaded"), or while it '
            'drains for shutdown ("Shutting down")',
            ok(ref("LlamaHealth")),
            (503,),
            tag="client",
        )
    }
    paths["/v1/models/{model_id}"] = {
        # On the path item: every operation of the path (OPTIONS too) takes it.
        "parameters": [
            {
                "name": "model_id",
                "in": "path",
                "required": True,
                "description": "A served name or an alias (may contain '/').",
                "schema": {"type": "string", "minLength": 1},
            }
        ],
        "get": operation(
            "/v1/models/{model_id}",
            "retrieveModel",
            "One served model: its /v1/models row. An alias stands for its target; an id "
            "that names no served model is 404 model_not_found (even with one loaded)",
            ok(ref("Model")),
            (404,),
            tag="client",
        ),
    }
    for alias, target in NO_V1_ALIASES.items():
        item = copy.deepcopy(paths[target])
        for method, op in item.items():
            if method not in METHODS:
                continue
            op["operationId"] += "NoV1"
            op["summary"] = f"{target} without /v1 (some clients' base URL): {op['summary']}"
        paths[alias] = item


def add_debug_paths(paths: dict[str, dict]) -> None:
    """The test hook PANTHEON_DEBUG_ROUTES turns on."""
    paths[DEBUG_PATH] = {
        "post": operation(
            DEBUG_PATH,
            "simulateMemoryPressure",
            "Test hook (PANTHEON_DEBUG_ROUTES): pin a model's memory-pressure level",
            ok(
                obj(
                    {
                        "model": STRING,
                        "memory_pressure": STRING,
                        "simulated": BOOL,
                        "max_concurrent": NON_NEGATIVE,
                        "max_concurrent_configured": NON_NEGATIVE,
                        "context_window": NON_NEGATIVE,
                        "context_window_configured": NON_NEGATIVE,
                    },
                    ("model", "memory_pressure", "simulated"),
                )
            ),
            (400, 404, 503),
            body=obj(
                {
                    "model": nullable(STRING),
                    "level": {
                        "anyOf": [
                            {"enum": ["normal", "elevated", "high", "critical"]},
                            {"type": "integer", "minimum": 0, "maximum": 3},
                            {"type": "null"},
                        ]
                    },
                },
                additionalProperties=True,
            ),
            tag="operator",
        )
    }
