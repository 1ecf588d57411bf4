"""The OpenAPI 3.1 document of every route, served at GET /openapi.json.

Written as code rather than generated (drf-spectacular): the chat route and the session
routes are plain Django views that parse their JSON by hand, and /session/watch is a
Channels consumer, so a generator would see empty bodies. The bounds come from the same
constants the validators use, and tests/api/test_openapi.py keeps the paths and methods
in step with the URL table.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from inference.engine.types import MAX_CHOICES, MAX_TOKENS_CLAMP
from operators.serializers import NAME_MAX
from pantheon_platform.errors import json_response, method_not_allowed
from pantheon_platform.runtime import MAX_CHAT_TEMPLATE_BYTES, MAX_DIES
from pantheon_platform.strict_json import (
    IDENTIFIER_MAX,
    INT64_BOUND,
    MAX_JSON_DEPTH,
    MAX_LOGIT_BIAS,
    MAX_STOP_STRINGS,
    REPETITION_PENALTY_MAX,
    TEMPERATURE_RANGE,
)
from pantheon_site import (
    openapi_anthropic,
    openapi_completions,
    openapi_meta,
    openapi_ollama,
    openapi_responses,
    routes,
)
from sessions.views import ESTIMATE_MAX, SESSION_ID_MAX, TOKEN_ID_LIMIT

OPENAPI_VERSION = "3.1.0"
DEBUG_PATH = "/admin/debug/simulate-memory-pressure"
# The HTTP methods an OpenAPI path item may hold an operation for.
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")

JSON = "application/json"
SSE = "text/event-stream"


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def _nullable(schema: dict) -> dict:
    """`schema` or null (JSON Schema 2020-12: OpenAPI 3.1 has no `nullable`)."""
    return {"anyOf": [schema, {"type": "null"}]}


def _object(properties: dict, required: tuple = (), **extra: Any) -> dict:
    schema = {"type": "object", "properties": properties, **extra}
    if required:
        schema["required"] = list(required)
    return schema


INT = {"type": "integer"}
NON_NEGATIVE = {"type": "integer", "minimum": 0}
NUMBER = {"type": "number"}
# What a request's integer (and unbounded number) fields take: |value| < 2**64.
INT64 = {"type": "integer", "minimum": 1 - INT64_BOUND, "maximum": INT64_BOUND - 1}
FINITE = {"type": "number", "exclusiveMinimum": -INT64_BOUND, "exclusiveMaximum": INT64_BOUND}
STRING = {"type": "string"}
BOOL = {"type": "boolean"}


# --- schemas ---------------------------------------------------------------------------

_ERROR = _object(
    {
        "error": _object(
            {
                "message": STRING,
                "type": {
                    "type": "string",
                    "description": "invalid_request_error, not_found, method_not_allowed, "
                    "model_not_found, context_over_budget, server_busy, "
                    "model_at_session_capacity, session_busy, session_not_found, "
                    "session_caching_disabled, bad_session_blob, weights_version_mismatch, "
                    "watch_unavailable, no_models_loaded, server_memory_constrained, "
                    "server_shutting_down, server_error, load_failed, unload_failed, "
                    "pin_failed, invalid_alias, alias_conflict, alias_not_found, "
                    "invalid_api_key, insufficient_scope, forbidden_host, forbidden_origin, "
                    "key_concurrency_exceeded, key_store_unavailable, request_too_large, "
                    "unsupported_media_type, ...",
                },
                # null; llama.cpp's shape on /health's 503 carries the status (503).
                "code": {"type": ["string", "integer", "null"]},
                "param": STRING,
            },
            ("message", "type", "code"),
            additionalProperties=True,
            description="Some types add fields, e.g. a streamed context_over_budget "
            "carries kv_used and kv_cap; a 400 about one field names it in param "
            "(e.g. messages[0].content holding a lone surrogate).",
        )
    },
    ("error",),
)

_CHAT_MESSAGE = _object(
    {
        "role": {
            "type": "string",
            "enum": ["system", "developer", "user", "assistant", "tool"],
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

_SESSION_ID = {"type": "string", "maxLength": SESSION_ID_MAX}


def _chat_request() -> dict:
    """POST /v1/chat/completions' body (inference.serializers.ChatCompletionRequest); the
    counts of messages and tools are settings."""
    return _object(
        {
            "model": _nullable(
                {
                    "type": "string",
                    "maxLength": IDENTIFIER_MAX,
                    "description": "Served name or alias; with one model loaded any value (or "
                    "none) routes to it.",
                }
            ),
            "messages": {
                "type": "array",
                "minItems": 1,
                "maxItems": settings.PANTHEON_MAX_MESSAGES,
                "items": _ref("ChatMessage"),
            },
            "temperature": _nullable(
                {
                    "type": "number",
                    "minimum": TEMPERATURE_RANGE[0],
                    "maximum": TEMPERATURE_RANGE[1],
                    "description": "Default 0.7; <= 0 is greedy.",
                }
            ),
            "top_p": _nullable(
                {"type": "number", "minimum": 0, "maximum": 1, "description": "Default 0.95."}
            ),
            "top_k": _nullable(
                {
                    "type": "integer",
                    "minimum": -(1 << 31),
                    "maximum": (1 << 31) - 1,
                    "description": "Default 40; <= 0 disables it.",
                }
            ),
            "max_tokens": _nullable(
                {
                    **INT64,
                    "description": f"Default 1024; 0 or negative means 512; clamped to "
                    f"{MAX_TOKENS_CLAMP}. Wins over max_completion_tokens.",
                }
            ),
            "max_completion_tokens": _nullable(INT64),
            "stop": _nullable(
                {
                    "anyOf": [
                        {"type": "string", "maxLength": IDENTIFIER_MAX},
                        {
                            "type": "array",
                            "maxItems": MAX_STOP_STRINGS,
                            "items": {"type": "string", "maxLength": IDENTIFIER_MAX},
                        },
                    ],
                    "description": "Stop strings.",
                }
            ),
            "seed": _nullable(
                {**INT64, "description": "With n > 1, choice i samples with seed + i."}
            ),
            "n": _nullable(
                {
                    **INT64,
                    "minimum": 1,
                    "description": f"Choices; more than {MAX_CHOICES} returns {MAX_CHOICES} with "
                    "n_status capped_to_8.",
                }
            ),
            "stream": _nullable(
                {**BOOL, "description": "true: an SSE stream (text/event-stream)."}
            ),
            "stream_options": _nullable(_object({"include_usage": _nullable(BOOL)})),
            "presence_penalty": _nullable({**FINITE, "description": "Clamped to [-2, 2]."}),
            "frequency_penalty": _nullable({**FINITE, "description": "Clamped to [-2, 2]."}),
            "repetition_penalty": _nullable(
                {
                    "type": "number",
                    "exclusiveMinimum": 0,
                    "maximum": REPETITION_PENALTY_MAX,
                    "description": "1 disables it.",
                }
            ),
            "min_p": _nullable({**FINITE, "description": "Clamped to [0, 1]."}),
            "logit_bias": _nullable(
                {
                    "type": "object",
                    "maxProperties": MAX_LOGIT_BIAS,
                    "additionalProperties": True,
                    "description": '{"<token id>": bias}; bias clamped to [-100, 100]; '
                    "non-numeric keys or values are skipped.",
                }
            ),
            "logprobs": _nullable(BOOL),
            "top_logprobs": _nullable(
                {**INT64, "description": "Clamped to [0, 20]; > 0 implies logprobs."}
            ),
            "response_format": _nullable(
                {
                    "type": "object",
                    "description": '{"type": "text" | "json_object" | "json_schema", '
                    '"json_schema": {"schema": ...}}.',
                }
            ),
            "enable_thinking": _nullable(BOOL),
            "reasoning_budget": _nullable(
                {**INT64, "description": "0 or negative: unbounded. Alias max_reasoning_tokens."}
            ),
            "max_reasoning_tokens": _nullable(INT64),
            "tools": _nullable(
                {
                    "type": "array",
                    "maxItems": settings.PANTHEON_MAX_TOOLS,
                    "items": {"type": "object"},
                    "description": "OpenAI tool definitions "
                    '({"type": "function", "function": {"name", "parameters"}}).',
                }
            ),
            "tool_choice": {
                "description": '"auto" (default), "none", "required", or '
                '{"type": "function", "function": {"name": ...}}.',
            },
            "session_id": _nullable({**_SESSION_ID, "description": "Prefix-cache session key."}),
            "prompt_cache_key": _nullable(_SESSION_ID),
            "promptCacheKey": _nullable(_SESSION_ID),
        },
        ("messages",),
        additionalProperties=True,
        description="Fields not listed are accepted and ignored. Arrays and objects nest at "
        f"most {MAX_JSON_DEPTH} levels deep.",
    )


_USAGE = _object(
    {
        "prompt_tokens": NON_NEGATIVE,
        "completion_tokens": NON_NEGATIVE,
        "total_tokens": NON_NEGATIVE,
        "prompt_tokens_details": _object({"cached_tokens": NON_NEGATIVE}, ("cached_tokens",)),
        "completion_tokens_details": _object(
            {"reasoning_tokens": NON_NEGATIVE}, ("reasoning_tokens",)
        ),
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

_TOP_LOGPROB = _object(
    {"token": STRING, "logprob": NUMBER, "bytes": {"type": "array", "items": NON_NEGATIVE}},
    ("token", "logprob", "bytes"),
)
_LOGPROBS = _object(
    {
        "content": {
            "type": "array",
            "items": _object(
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

_TOOL_CALL = _object(
    {
        "id": STRING,
        "type": {"const": "function"},
        "function": _object({"name": STRING, "arguments": STRING}, ("name", "arguments")),
    },
    ("id", "type", "function"),
)
_TOOL_CALL_ERROR = _object(
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

_CHAT_COMPLETION = _object(
    {
        "id": STRING,
        "object": {"const": "chat.completion"},
        "created": INT,
        "model": STRING,
        "choices": {
            "type": "array",
            "items": _object(
                {
                    "index": NON_NEGATIVE,
                    "message": _object(
                        {
                            "role": {"const": "assistant"},
                            "content": _nullable(STRING),
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
        "usage": _ref("Usage"),
        "n_status": _N_STATUS,
        "response_format_status": _FORMAT_STATUS,
        "response_format_message": STRING,
    },
    ("id", "object", "created", "model", "choices", "usage"),
)

_CHAT_STREAM = {
    "type": "string",
    "description": "Server-sent events: `data: {chat.completion.chunk}` lines (a role chunk "
    "per choice, content/reasoning/tool-call deltas, a closing chunk with finish_reason, a "
    "usage chunk with stream_options.include_usage), then `data: [DONE]`. A "
    "context_over_budget found after the stream opened is a terminal `data: {error}` event.",
}

_MODEL_ENTRY = _object(
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
    },
    ("id", "object", "created", "owned_by", "max_sessions", "max_concurrent"),
)

_HEALTH = _object(
    {
        "service": {"const": "pantheon"},
        "status": {"const": "ok"},
        "backend": {"type": "string", "description": "cpu or cuda"},
        "kernel": {
            "type": "string",
            "enum": ["cpu", "numpy"],
            "description": "cpu: compiled kernels on the GGUF blocks; numpy: the float32 "
            "reference (also when the kernels could not be built)",
        },
        "kernel_isa": {"type": "string", "description": "avx512, avx2 or generic (cpu only)"},
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
    },
    ("service", "status", "backend", "kernel", "build", "accelerator", "dies_visible", "models"),
)

_INSTANCE = _object(
    {
        "id": STRING,
        "object": {"const": "model"},
        "status": {"type": "string", "enum": ["loaded", "unloading"]},
        "path": STRING,
        "architecture": STRING,
        "quantization": STRING,
        "weights_version": {"type": "string", "description": "Hash of the weights."},
        "created": INT,
        "loaded_at": INT,
        "dies": {"type": "array", "items": NON_NEGATIVE},
        "vram_bytes": NON_NEGATIVE,
        "host_bytes": NON_NEGATIVE,
        "max_sessions": NON_NEGATIVE,
        "max_concurrent": NON_NEGATIVE,
        "max_concurrent_configured": NON_NEGATIVE,
        "reasoning_budget": INT,
        "chat_template": {"type": "string", "enum": ["gguf", "custom"]},
        "quantize": BOOL,
        "pooling": {"enum": ["mean", "last", "cls"]},
        "pinned": BOOL,
        "in_flight": NON_NEGATIVE,
        "aliases": {"type": "array", "items": STRING},
        "load_seconds": NUMBER,
        "weight_cache_used": BOOL,
        "kernel": {"type": "string", "enum": ["cpu", "numpy"]},
        "kernel_isa": STRING,
        "kernel_fallback": {
            "type": "object",
            "description": "tensor type -> tensors dequantised to float32 (no kernel)",
            "additionalProperties": NON_NEGATIVE,
        },
        "context_window": {"type": "integer", "minimum": 1},
        "context_window_configured": {"type": "integer", "minimum": 1},
    },
    (
        "id",
        "object",
        "status",
        "path",
        "dies",
        "vram_bytes",
        "max_sessions",
        "max_concurrent",
        "max_concurrent_configured",
        "pinned",
    ),
)

_AVAILABLE = _object(
    {
        "path": STRING,
        "name": STRING,
        "size_bytes": NON_NEGATIVE,
        "architecture": STRING,
        "quantization": STRING,
        "n_params": NON_NEGATIVE,
        "context_length": _nullable(NON_NEGATIVE),
        "error": {"type": "string", "description": "Present when the file cannot be read."},
        "loaded": BOOL,
        "loaded_as": {"type": "array", "items": STRING},
    },
    ("path", "name", "size_bytes", "loaded", "loaded_as"),
)

_DIES = _object(
    {
        "object": {"const": "list"},
        "n_dies": NON_NEGATIVE,
        "data": {
            "type": "array",
            "items": _object(
                {
                    "die": NON_NEGATIVE,
                    "card": NON_NEGATIVE,
                    "model": STRING,
                    "n_models": NON_NEGATIVE,
                    "vram_budget": NON_NEGATIVE,
                    "vram_used": NON_NEGATIVE,
                },
                ("die", "card", "model", "n_models", "vram_budget", "vram_used"),
            ),
        },
    },
    ("object", "n_dies", "data"),
)

_NAME = {"type": "string", "maxLength": NAME_MAX}
# A required name: not blank once trimmed (operators.serializers.NameField).
_GIVEN_NAME = {**_NAME, "minLength": 1, "pattern": r"\S"}
_OPTION = {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "null"}]}

_LOAD_REQUEST = _object(
    {
        "path": {
            "type": "string",
            "maxLength": 4096,
            "description": "A GGUF file inside PANTHEON_MODEL_DIRS (a relative path is "
            "looked up in them).",
        },
        "name": _nullable({**_NAME, "description": "Served name; default: the file name."}),
        "dies": _nullable(
            {
                "type": "array",
                "items": {"type": "integer", "minimum": 0, "maximum": 1 << 16},
                "maxItems": MAX_DIES,
            },
        ),
        "quantize": _nullable(BOOL),
        "pooling": _nullable(
            {
                "enum": ["mean", "last", "cls"],
                "description": "How /v1/embeddings pools hidden states; default: the "
                "architecture's (mean; last for gemma3).",
            }
        ),
        "ctx_cap": _nullable({**NON_NEGATIVE, "maximum": 1 << 24}),
        "max_sessions": _nullable({**NON_NEGATIVE, "maximum": 1024}),
        "max_concurrent": _nullable({**NON_NEGATIVE, "maximum": 1024}),
        "reasoning_budget": _nullable({**NON_NEGATIVE, "maximum": 1 << 24}),
        "pinned": _nullable(BOOL),
        "chat_template": _nullable(
            {
                "type": "string",
                "maxLength": MAX_CHAT_TEMPLATE_BYTES,
                "description": "A template's text, or a file inside the model folders.",
            }
        ),
    },
    ("path",),
    additionalProperties=True,
)

_MODEL_NAME = {"type": "string", "maxLength": SESSION_ID_MAX}
_SESSION_BODY = {
    "name": _nullable({**_MODEL_NAME, "description": "The model; absent: the default."}),
    "session_id": _SESSION_ID,
}

_SCHEMAS = {
    "Error": _ERROR,
    "ChatMessage": _CHAT_MESSAGE,
    "ChatCompletion": _CHAT_COMPLETION,
    "Usage": _USAGE,
    "Health": _HEALTH,
    "ModelList": _object(
        {
            "object": {"const": "list"},
            "backend": STRING,
            "build": STRING,
            "data": {"type": "array", "items": _MODEL_ENTRY},
        },
        ("object", "backend", "build", "data"),
    ),
    "Instance": _INSTANCE,
    "InstanceList": _object(
        {"object": {"const": "list"}, "data": {"type": "array", "items": _ref("Instance")}},
        ("object", "data"),
    ),
    "AvailableList": _object(
        {"object": {"const": "list"}, "data": {"type": "array", "items": _AVAILABLE}},
        ("object", "data"),
    ),
    "DieList": _DIES,
    "LoadRequest": _LOAD_REQUEST,
    "AliasList": _object(
        {
            "object": {"const": "list"},
            "data": {
                "type": "array",
                "items": _object(
                    {
                        "alias": STRING,
                        "target": STRING,
                        "resolves_to": _nullable(STRING),
                        "loaded": BOOL,
                    },
                    ("alias", "target", "resolves_to", "loaded"),
                ),
            },
        },
        ("object", "data"),
    ),
}


# --- responses -------------------------------------------------------------------------

_RETRY_AFTER = {"Retry-After": {"schema": {"type": "integer", "minimum": 1}}}

# status -> (component name, description)
_ERRORS = {
    400: ("BadRequest", "invalid_request_error: an empty, malformed or invalid body or query."),
    401: (
        "Unauthorized",
        "invalid_api_key: keys are configured and none, or an unknown one, was sent.",
    ),
    403: (
        "Forbidden",
        "insufficient_scope (the key lacks the route's scope), forbidden_host "
        "(Host not allowed), forbidden_origin (a browser Origin not allowed).",
    ),
    404: ("NotFound", "model_not_found, session_not_found, alias_not_found, or not_found."),
    405: ("MethodNotAllowed", "method_not_allowed, with Allow: the route's methods."),
    409: (
        "Conflict",
        "Already loaded or unloading, an alias conflict, or weights_version_mismatch.",
    ),
    413: (
        "PayloadTooLarge",
        "request_too_large: the body is over its route class's limit (answered before it is read).",
    ),
    415: (
        "UnsupportedMediaType",
        "unsupported_media_type: a POST/PUT/PATCH/DELETE to an operator or session route "
        "declared a Content-Type other than JSON (none is fine).",
    ),
    422: ("ContextOverBudget", "context_over_budget: the prompt is longer than the window."),
    429: (
        "TooManyRequests",
        "server_busy, model_at_session_capacity, session_busy, or key_concurrency_exceeded "
        "(the key's concurrent requests); with Retry-After when known.",
    ),
    500: ("ServerError", "server_error (never a traceback)."),
    503: (
        "ServiceUnavailable",
        "no_models_loaded, server_memory_constrained, server_shutting_down, "
        "watch_unavailable, or key_store_unavailable (keyed routes: the key table cannot be "
        "read); with Retry-After when known.",
    ),
    507: ("InsufficientStorage", "load_failed: admission refused (memory)."),
}


def _error_response(description: str) -> dict:
    response = {"description": description, "content": {JSON: {"schema": _ref("Error")}}}
    return response


def _responses_components() -> dict:
    out = {}
    for status, (name, description) in _ERRORS.items():
        response = _error_response(description)
        if status in (429, 503):
            response["headers"] = _RETRY_AFTER
        if status == 405:
            response["headers"] = {"Allow": {"schema": STRING}}
        if status == 401:
            response["headers"] = {"WWW-Authenticate": {"schema": STRING}}
        out[name] = response
    return out


def _ok(schema: dict, description: str = "OK") -> dict:
    return {"description": description, "content": {JSON: {"schema": schema}}}


# --- operations ------------------------------------------------------------------------


def _operation(
    path: str,
    operation_id: str,
    summary: str,
    ok: dict,
    errors: tuple[int, ...] = (),
    *,
    body: dict | None = None,
    parameters: list | None = None,
    tag: str,
) -> dict:
    """One operation: its success and its own errors (the layers' are added by
    _add_layer_errors, which knows the method)."""
    scope = routes.scope_for(path)
    statuses = set(errors) | {500}
    op: dict[str, Any] = {
        "operationId": operation_id,
        "summary": summary,
        "tags": [tag],
        "x-pantheon-scope": scope,
        "responses": {"200": ok},
    }
    if scope == routes.OPEN:
        op["security"] = []
    else:
        op["security"] = [{}, {"bearer": [scope]}, {"apiKey": [scope]}]
    for status in sorted(statuses):
        op["responses"][str(status)] = {"$ref": f"#/components/responses/{_ERRORS[status][0]}"}
    if body is not None:
        op["requestBody"] = {"required": True, "content": {JSON: {"schema": body}}}
    if parameters:
        op["parameters"] = parameters
    return op


BODY_METHODS = ("post", "put", "patch", "delete")


def _layer_errors(path: str, method: str) -> set[int]:
    """What the ASGI layers (pantheon_site/stack.py) may answer before the view: the Host
    and Origin checks (403) and the body limit (413) on every route; on a keyed route the
    key check (401, 403 insufficient_scope, 429 key_concurrency_exceeded, 503
    key_store_unavailable); 415 for a declared non-JSON body to a management route."""
    statuses = {403, 413}
    if routes.scope_for(path) != routes.OPEN:
        statuses |= {401, 429, 503}
    if method in BODY_METHODS and routes.is_management(path):
        statuses.add(415)
    return statuses


def _add_layer_errors(path: str, method: str, op: dict) -> None:
    responses = op["responses"]
    for status in _layer_errors(path, method):
        responses.setdefault(str(status), {"$ref": f"#/components/responses/{_ERRORS[status][0]}"})
    op["responses"] = dict(sorted(responses.items()))


def _preflight(operation_id: str) -> dict:
    return {
        "operationId": f"{operation_id}Preflight",
        "summary": "CORS preflight: 200 {} on any path",
        "tags": ["cors"],
        "security": [],
        "responses": {
            "200": {
                "description": "The preflight answer.",
                "headers": {
                    "Access-Control-Allow-Methods": {"schema": STRING},
                    "Access-Control-Allow-Headers": {"schema": STRING},
                },
                "content": {JSON: {"schema": {"type": "object", "maxProperties": 0}}},
            },
            "403": {"$ref": "#/components/responses/Forbidden"},
        },
    }


def _session_header() -> dict:
    return {
        "name": "X-Session-Id",
        "in": "header",
        "required": False,
        "description": "The session id when the body (or query) gives none.",
        "schema": {"type": "string", "maxLength": SESSION_ID_MAX},
    }


def _query(name: str, schema: dict, required: bool = False, description: str = "") -> dict:
    param = {"name": name, "in": "query", "required": required, "schema": schema}
    if description:
        param["description"] = description
    return param


def _paths(debug_routes: bool) -> dict[str, dict]:
    chat_ok = {
        "description": "A completion, or (stream: true) an event stream.",
        "content": {JSON: {"schema": _ref("ChatCompletion")}, SSE: {"schema": _CHAT_STREAM}},
    }
    paths: dict[str, dict] = {
        "/": {
            "get": _operation(
                "/",
                "health",
                "Health: backend, build, each model's state",
                _ok(_ref("Health")),
                tag="client",
            )
        },
        "/openapi.json": {
            "get": _operation(
                "/openapi.json",
                "openapi",
                "This document",
                _ok(
                    _object(
                        {
                            "openapi": STRING,
                            "info": {"type": "object"},
                            "paths": {"type": "object"},
                        },
                        ("openapi", "info", "paths"),
                    )
                ),
                tag="client",
            )
        },
        "/v1/models": {
            "get": _operation(
                "/v1/models",
                "listModels",
                "The served models",
                _ok(_ref("ModelList")),
                tag="client",
            )
        },
        "/v1/chat/completions": {
            "post": _operation(
                "/v1/chat/completions",
                "createChatCompletion",
                "OpenAI-compatible chat completion (JSON or SSE)",
                chat_ok,
                (400, 404, 422, 429, 503),
                body=_ref("ChatCompletionRequest"),
                parameters=[_session_header()],
                tag="client",
            )
        },
        "/admin/models": {
            "get": _operation(
                "/admin/models",
                "listInstances",
                "Every live instance, operator fields",
                _ok(_ref("InstanceList")),
                tag="operator",
            )
        },
        "/admin/models/load": {
            "post": _operation(
                "/admin/models/load",
                "loadModel",
                "Load a model (one load at a time)",
                _ok(_ref("Instance")),
                (400, 404, 409, 507),
                body=_ref("LoadRequest"),
                tag="operator",
            )
        },
        "/admin/models/unload": {
            "post": _operation(
                "/admin/models/unload",
                "unloadModel",
                "Unload a model once its in-flight generations finish",
                _ok(
                    _object(
                        {"unloaded": STRING, "drained": BOOL, "in_flight": NON_NEGATIVE},
                        ("unloaded", "drained"),
                    )
                ),
                (400, 404, 409),
                body=_object({"name": _GIVEN_NAME}, ("name",), additionalProperties=True),
                tag="operator",
            )
        },
        "/admin/models/pin": {
            "post": _operation(
                "/admin/models/pin",
                "pinModel",
                "Pin a model (never evicted) or unpin it",
                _ok(_object({"name": STRING, "pinned": BOOL}, ("name", "pinned"))),
                (400, 404, 409),
                body=_object(
                    {"name": _GIVEN_NAME, "pinned": BOOL},
                    ("name", "pinned"),
                    additionalProperties=True,
                ),
                tag="operator",
            )
        },
        "/admin/models/available": {
            "get": _operation(
                "/admin/models/available",
                "listAvailableModels",
                "The GGUF files under PANTHEON_MODEL_DIRS",
                _ok(_ref("AvailableList")),
                tag="operator",
            )
        },
        "/admin/dies": {
            "get": _operation(
                "/admin/dies",
                "listDies",
                "Accelerator dies and their memory",
                _ok(_ref("DieList")),
                tag="operator",
            )
        },
        "/admin/aliases": {
            "get": _operation(
                "/admin/aliases",
                "listAliases",
                "Aliases and what they resolve to",
                _ok(_ref("AliasList")),
                tag="operator",
            ),
            "post": _operation(
                "/admin/aliases",
                "setAlias",
                "Create or move an alias",
                _ok(_object({"alias": STRING, "target": STRING}, ("alias", "target"))),
                (400, 404, 409),
                body=_object(
                    {
                        "alias": _GIVEN_NAME,
                        "target": _GIVEN_NAME,
                        "model": {**_GIVEN_NAME, "description": "Accepted for target."},
                    },
                    ("alias",),
                    additionalProperties=True,
                    description="`target` (or `model`) is required.",
                    anyOf=[{"required": ["target"]}, {"required": ["model"]}],
                ),
                tag="operator",
            ),
        },
        "/admin/aliases/{alias}": {
            # On the path item: every operation of the path (OPTIONS too) takes it.
            "parameters": [
                {
                    "name": "alias",
                    "in": "path",
                    "required": True,
                    "description": "May contain '/'.",
                    "schema": {"type": "string", "minLength": 1, "maxLength": NAME_MAX},
                }
            ],
            "delete": _operation(
                "/admin/aliases/{alias}",
                "deleteAlias",
                "Delete an alias",
                _ok(_object({"deleted": STRING}, ("deleted",))),
                (400, 404),
                tag="operator",
            ),
        },
        "/admin/session/export": {
            "post": _operation(
                "/admin/session/export",
                "exportSession",
                "A session's most recent conversation as a base64 blob plus its tokens",
                _ok(
                    _object(
                        {
                            "session_id": STRING,
                            "namespace": {
                                "type": "string",
                                "description": "Whose session: its API key's namespace.",
                            },
                            "weights_version": {
                                "type": "string",
                                "description": "Hash of the weights.",
                            },
                            "n_tok": NON_NEGATIVE,
                            "blob_bytes": NON_NEGATIVE,
                            "blob_b64": STRING,
                            "tokens": {"type": "array", "items": NON_NEGATIVE},
                        },
                        (
                            "session_id",
                            "weights_version",
                            "n_tok",
                            "blob_bytes",
                            "blob_b64",
                            "tokens",
                        ),
                    )
                ),
                (400, 404, 429, 503),
                body=_object(
                    {
                        **_SESSION_BODY,
                        "namespace": {
                            "type": "string",
                            "minLength": 1,
                            "description": "Whose session, when several API keys hold the id.",
                        },
                    },
                    ("session_id",),
                    additionalProperties=True,
                ),
                tag="sessions",
            )
        },
        "/session/restore": {
            "post": _operation(
                "/session/restore",
                "restoreSession",
                "Install an exported conversation",
                _ok(
                    _object(
                        {"restored": {"const": True}, "session_id": STRING, "n_tok": NON_NEGATIVE},
                        ("restored", "session_id", "n_tok"),
                    )
                ),
                (400, 404, 409, 429, 503),
                body=_object(
                    {
                        **_SESSION_BODY,
                        "blob": {"type": "string", "description": "blob_b64 of an export"},
                        "tokens": {
                            "type": "array",
                            "items": {
                                "type": "integer",
                                "minimum": 0,
                                "maximum": TOKEN_ID_LIMIT - 1,
                            },
                        },
                    },
                    ("blob", "tokens"),
                    additionalProperties=True,
                    description="session_id here or in X-Session-Id.",
                ),
                parameters=[_session_header()],
                tag="sessions",
            )
        },
        "/session/release": {
            "post": _operation(
                "/session/release",
                "releaseSession",
                "Free every conversation of a session id now (idempotent)",
                _ok(
                    _object(
                        {"released": {"const": True}, "session_id": STRING},
                        ("released", "session_id"),
                    )
                ),
                (400, 404, 503),
                body=_object(
                    _SESSION_BODY,
                    additionalProperties=True,
                    description="session_id here or in X-Session-Id.",
                ),
                parameters=[_session_header()],
                tag="sessions",
            )
        },
        "/session/estimate": {
            "get": _operation(
                "/session/estimate",
                "estimateSession",
                "Restoring from a blob vs re-prefilling, by arithmetic",
                _ok(
                    _object(
                        {
                            "model": STRING,
                            "tokens": {"type": "integer", "minimum": 1},
                            "prefill_tok_per_s": NUMBER,
                            "cold_reprefill_s": NUMBER,
                            "warm_restore_s": NUMBER,
                            "blob_bytes_est": NON_NEGATIVE,
                            "prefill_rate_measured": BOOL,
                        },
                        (
                            "model",
                            "tokens",
                            "prefill_tok_per_s",
                            "cold_reprefill_s",
                            "warm_restore_s",
                            "blob_bytes_est",
                            "prefill_rate_measured",
                        ),
                    )
                ),
                (400,),
                parameters=[
                    _query(
                        "tokens",
                        {"type": "integer", "minimum": 1, "maximum": ESTIMATE_MAX},
                        required=True,
                    ),
                    _query("name", _MODEL_NAME, description='Unknown: model is "".'),
                    _query(
                        "blob_bytes", {"type": "integer", "minimum": 1, "maximum": ESTIMATE_MAX}
                    ),
                    _query(
                        "upload_bps",
                        {"type": "number", "exclusiveMinimum": 0},
                        description="Bytes/s; default 12.5e6.",
                    ),
                ],
                tag="sessions",
            )
        },
        "/session/watch": {
            "get": _operation(
                "/session/watch",
                "watchSession",
                "Hold a session alive while connected (a long-held event stream)",
                {
                    "description": "`: watch established`, then `: keepalive` comments "
                    "until the client goes.",
                    "content": {SSE: {"schema": {"type": "string"}}},
                },
                (400, 404, 503),
                parameters=[
                    _query(
                        "session_id",
                        {"type": "string", "maxLength": SESSION_ID_MAX},
                        description="Or X-Session-Id.",
                    ),
                    _query("name", STRING),
                    _session_header(),
                ],
                tag="sessions",
            )
        },
    }
    openapi_meta.add_paths(paths)  # /health, /v1/models/{model_id}, the /v1-less aliases
    openapi_responses.add_paths(paths)  # /v1/responses, /v1/responses/{response_id}
    openapi_completions.add_paths(paths)  # /v1/completions, /v1/embeddings, /tokenize, ...
    openapi_anthropic.add_paths(paths)  # /v1/messages, /v1/messages/count_tokens
    openapi_ollama.add_paths(paths)  # /api/chat, /api/generate, /api/tags, ... (Ollama's)
    if debug_routes:
        paths[DEBUG_PATH] = {
            "post": _operation(
                DEBUG_PATH,
                "simulateMemoryPressure",
                "Test hook (PANTHEON_DEBUG_ROUTES): pin a model's memory-pressure level",
                _ok(
                    _object(
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
                body=_object(
                    {
                        "model": _nullable(STRING),
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
    for path, item in paths.items():
        for method, op in item.items():
            if method in METHODS:
                _add_layer_errors(path, method, op)
        first = next(op for method, op in item.items() if method in METHODS)
        item["options"] = _preflight(first["operationId"])
    return paths


def _document(debug_routes: bool) -> dict:
    return {
        "openapi": OPENAPI_VERSION,
        "info": {
            "title": "Pantheon",
            "version": _version(),
            "description": "OpenAI-compatible inference server. Every error has the shape "
            '{"error": {"message", "type", "code": null}}; a method a path does not list '
            "is 405 method_not_allowed (with Allow), an unknown path 404 not_found. API "
            "keys are optional: only when keys are configured does a keyed route need one "
            "(Authorization: Bearer, or X-API-Key) carrying the route's scope "
            "(x-pantheon-scope).",
        },
        "servers": [{"url": "/"}],
        "security": [{}, {"bearer": []}, {"apiKey": []}],
        "tags": [
            {"name": "client", "description": "The OpenAI-compatible routes."},
            {"name": "operator", "description": "Model management (/admin/...)."},
            {"name": "sessions", "description": "Session export, restore, release, watch."},
            {"name": "cors", "description": "OPTIONS on any path."},
        ],
        "paths": _paths(debug_routes),
        "components": {
            "schemas": {
                **_SCHEMAS,
                **openapi_meta.schemas(),
                **openapi_responses.schemas(),
                **openapi_completions.schemas(),
                **openapi_anthropic.schemas(),
                **openapi_ollama.schemas(),
                "ChatCompletionRequest": _chat_request(),
            },
            "responses": _responses_components(),
            "securitySchemes": {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "An API key as a bearer token.",
                },
                "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
            },
        },
    }


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("pantheon")
    except PackageNotFoundError:  # run from a checkout that was never pip-installed
        return "0+unknown"


def document() -> dict:
    """The document for this process's settings (the debug route only when enabled)."""
    return _document(bool(getattr(settings, "PANTHEON_DEBUG_ROUTES", False)))


@csrf_exempt
def openapi_view(request: HttpRequest) -> HttpResponse:
    """GET /openapi.json (open: no key needed)."""
    if request.method != "GET":
        return method_not_allowed(request.method or "", ["GET", "OPTIONS"]).response()
    return json_response(document())
