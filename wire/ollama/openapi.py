"""The OpenAPI pieces of Ollama's API (wire/ollama): /api/chat, /api/generate,
/api/embed, /api/embeddings, /api/tags, /api/ps, /api/show, /api/version, and the model
management routes every call of which is refused (/api/pull, /push, /create, /delete,
/copy). The bounds are the parser's (wire/ollama/request.py) and the settings it reads.

The routes' own errors have Ollama's shape ({"error": "message"}); what the ASGI layers
answer before a route (key, Host, Origin, body limit) has the server's.

pantheon_site/openapi.py calls add_paths() with its paths and merges schemas()."""

from __future__ import annotations

from django.conf import settings

from pantheon_platform.durations import DURATION_MAX_CHARS
from pantheon_platform.openapi import (
    BOOL,
    FINITE,
    INT64,
    JSON,
    NON_NEGATIVE,
    NUMBER,
    STRING,
)
from pantheon_platform.openapi import RETRY_AFTER as _RETRY_AFTER
from pantheon_platform.openapi import nullable as _nullable
from pantheon_platform.openapi import obj as _object
from pantheon_platform.openapi import operation as _operation
from pantheon_platform.strict_json import IDENTIFIER_MAX, MAX_STOP_STRINGS
from wire.ollama.render import NDJSON
from wire.ollama.request import (
    DURATION_PATTERN,
    MAX_EMBED_INPUTS,
    MESSAGE_ROLES,
    THINK_LEVELS,
)
from wire.ollama.views import MANAGED, managed_method


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def schemas() -> dict:
    model = {"type": "string", "minLength": 1, "maxLength": IDENTIFIER_MAX}
    keep_alive = _nullable(
        {
            "anyOf": [
                FINITE,
                {"type": "string", "maxLength": DURATION_MAX_CHARS, "pattern": DURATION_PATTERN},
            ],
            "description": 'Seconds or a duration ("5m", "-1"): accepted; models stay '
            "loaded as the operator loaded them.",
        }
    )
    options = _nullable(
        _object(
            {
                "num_predict": _nullable({**INT64, "description": "<= 0: the default, 1024."}),
                "num_ctx": _nullable(
                    {
                        **INT64,
                        "minimum": 1,
                        "description": "Above the served window: a 400 (not truncated).",
                    }
                ),
                "temperature": _nullable({"type": "number", "minimum": -100, "maximum": 100}),
                "top_k": _nullable(
                    {"type": "integer", "minimum": -(1 << 31), "maximum": (1 << 31) - 1}
                ),
                "top_p": _nullable({"type": "number", "minimum": 0, "maximum": 1}),
                "min_p": _nullable({"type": "number", "minimum": 0, "maximum": 1}),
                "seed": _nullable(INT64),
                "stop": _nullable(
                    {
                        "anyOf": [
                            {"type": "string", "maxLength": IDENTIFIER_MAX},
                            {
                                "type": "array",
                                "maxItems": MAX_STOP_STRINGS,
                                "items": {"type": "string", "maxLength": IDENTIFIER_MAX},
                            },
                        ]
                    }
                ),
                "repeat_penalty": _nullable(
                    {"type": "number", "exclusiveMinimum": 0, "maximum": 100}
                ),
                "presence_penalty": _nullable(FINITE),
                "frequency_penalty": _nullable(FINITE),
            },
            additionalProperties=True,
            description="Sampling options; unknown ones are ignored (as Ollama does).",
        )
    )
    call = _object(
        {
            "id": STRING,
            "function": _object(
                {
                    "index": NON_NEGATIVE,
                    "name": STRING,
                    "arguments": {"type": "object"},
                },
                ("name", "arguments"),
            ),
        },
        ("function",),
    )
    message = _object(
        {
            "role": {"enum": list(MESSAGE_ROLES)},
            "content": _nullable(STRING),
            "thinking": _nullable(STRING),
            "images": _nullable(
                {
                    "type": "array",
                    "maxItems": 0,
                    "description": "Images are a 400 naming the field: no model here reads them.",
                }
            ),
            "tool_calls": _nullable({"type": "array", "items": call}),
            "tool_name": _nullable(STRING),
            "tool_call_id": _nullable(STRING),
        },
        ("role",),
        additionalProperties=True,
    )
    common = {
        "model": model,
        "stream": _nullable({**BOOL, "description": "Default true: NDJSON lines."}),
        "format": _nullable(
            {
                "anyOf": [{"enum": ["", "json"]}, {"type": "object"}],
                "description": 'A JSON schema, or "json".',
            }
        ),
        "options": options,
        "keep_alive": keep_alive,
        "think": _nullable({"anyOf": [BOOL, {"enum": list(THINK_LEVELS)}]}),
        "logprobs": _nullable(BOOL),
        "top_logprobs": _nullable({"type": "integer", "minimum": 0, "maximum": 20}),
    }
    durations = {
        "done": BOOL,
        "done_reason": STRING,
        "total_duration": NON_NEGATIVE,
        "load_duration": NON_NEGATIVE,
        "prompt_eval_count": NON_NEGATIVE,
        "prompt_eval_duration": NON_NEGATIVE,
        "eval_count": NON_NEGATIVE,
        "eval_duration": NON_NEGATIVE,
    }
    logprob = _object({"token": STRING, "logprob": NUMBER}, ("token", "logprob"))
    details = _object(
        {
            "parent_model": STRING,
            "format": {"const": "gguf"},
            "family": STRING,
            "families": {"type": "array", "items": STRING},
            "parameter_size": STRING,
            "quantization_level": STRING,
        },
        ("format", "family", "families", "parameter_size", "quantization_level"),
    )
    row = {
        "name": STRING,
        "model": STRING,
        "modified_at": STRING,
        "size": NON_NEGATIVE,
        "digest": STRING,
        "details": details,
    }
    return {
        "OllamaChatRequest": _object(
            {
                **common,
                "messages": _nullable(
                    {
                        "type": "array",
                        "maxItems": settings.PANTHEON_MAX_MESSAGES,
                        "items": message,
                        "description": 'Empty or absent: Ollama\'s "load the model" answer.',
                    }
                ),
                "tools": _nullable(
                    {
                        "type": "array",
                        "maxItems": settings.PANTHEON_MAX_TOOLS,
                        "items": _object(
                            {"type": {"const": "function"}, "function": {"type": "object"}},
                            ("function",),
                            additionalProperties=True,
                        ),
                    }
                ),
            },
            ("model",),
            additionalProperties=True,
        ),
        "OllamaGenerateRequest": _object(
            {
                **common,
                "prompt": _nullable(STRING),
                "system": _nullable(STRING),
                "raw": _nullable({**BOOL, "description": "The prompt as is: no template."}),
                "template": _nullable({**STRING, "description": "Non-empty: a 400."}),
                "suffix": _nullable({**STRING, "description": "Non-empty: a 400."}),
                "context": _nullable(
                    {"type": "array", "maxItems": 0, "description": "Non-empty: a 400."}
                ),
                "images": _nullable({"type": "array", "maxItems": 0}),
            },
            ("model",),
            additionalProperties=True,
        ),
        "OllamaChatResponse": _object(
            {
                "model": STRING,
                "created_at": STRING,
                "message": _object(
                    {
                        "role": {"const": "assistant"},
                        "content": STRING,
                        "thinking": STRING,
                        "tool_calls": {"type": "array", "items": call},
                    },
                    ("role", "content"),
                ),
                "logprobs": {"type": "array", "items": logprob},
                **durations,
            },
            ("model", "created_at", "message", "done"),
        ),
        "OllamaGenerateResponse": _object(
            {
                "model": STRING,
                "created_at": STRING,
                "response": STRING,
                "thinking": STRING,
                "logprobs": {"type": "array", "items": logprob},
                **durations,
            },
            ("model", "created_at", "response", "done"),
        ),
        "OllamaEmbedRequest": _object(
            {
                "model": model,
                "input": {
                    "anyOf": [
                        STRING,
                        {"type": "array", "maxItems": MAX_EMBED_INPUTS, "items": STRING},
                    ]
                },
                "truncate": _nullable(BOOL),
                "dimensions": _nullable(INT64),
                "options": options,
                "keep_alive": keep_alive,
            },
            ("model",),
            additionalProperties=True,
        ),
        "OllamaEmbeddingsRequest": _object(
            {
                "model": model,
                "prompt": _nullable(STRING),
                "options": options,
                "keep_alive": keep_alive,
            },
            ("model",),
            additionalProperties=True,
        ),
        "OllamaEmbedResponse": _object(
            {
                "model": STRING,
                "embeddings": {"type": "array", "items": {"type": "array", "items": NUMBER}},
                "total_duration": NON_NEGATIVE,
                "load_duration": NON_NEGATIVE,
                "prompt_eval_count": NON_NEGATIVE,
            },
            ("model", "embeddings"),
        ),
        "OllamaEmbeddingsResponse": _object(
            {"embedding": {"type": "array", "items": NUMBER}}, ("embedding",)
        ),
        "OllamaModelRequest": _object(
            {"model": model, "name": model, "verbose": _nullable(BOOL)},
            additionalProperties=True,
        ),
        "OllamaTags": _object(
            {"models": {"type": "array", "items": _object(row, tuple(row))}}, ("models",)
        ),
        "OllamaPs": _object(
            {
                "models": {
                    "type": "array",
                    "items": _object(
                        {
                            **{k: v for k, v in row.items() if k != "modified_at"},
                            "expires_at": STRING,
                            "size_vram": NON_NEGATIVE,
                            "context_length": NON_NEGATIVE,
                        },
                        ("name", "model", "size", "digest", "details", "expires_at", "size_vram"),
                    ),
                }
            },
            ("models",),
        ),
        "OllamaShow": _object(
            {
                "modelfile": STRING,
                "parameters": STRING,
                "template": STRING,
                "details": details,
                "model_info": {"type": "object"},
                "capabilities": {"type": "array", "items": STRING},
                "modified_at": STRING,
                "context_length": NON_NEGATIVE,
            },
            ("parameters", "template", "details", "model_info"),
        ),
        "OllamaVersion": _object({"version": STRING, "pantheon": STRING}, ("version",)),
        "OllamaError": _object({"error": STRING}, ("error",)),
    }


def _error(description: str) -> dict:
    """The route's errors in Ollama's shape; the ASGI layers (and Django's own handlers)
    answer before it in the server's shape."""
    schema = {"anyOf": [_ref("OllamaError"), _ref("Error")]}
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def _responses(ok: dict, *, body: bool) -> dict:
    busy = _error(
        "The server is busy (queue full or timed out, prepare pool), the model's sessions "
        "are all held; the key's concurrency limit. With Retry-After."
    )
    busy["headers"] = _RETRY_AFTER
    unavailable = _error(
        "No model loaded, memory pressure, shutting down; the key table unreadable. With "
        "Retry-After when known."
    )
    unavailable["headers"] = _RETRY_AFTER
    out = {
        "200": ok,
        "401": _error("Keys are configured and none, or an unknown one, was sent."),
        "403": _error(
            "The key lacks the inference scope, Host or Origin not allowed; on the model "
            "management routes, every call (models are the operator's)."
        ),
        "404": _error("`model` names no served model (nor an alias): Ollama's 404."),
        "405": _error("A method the route does not take (with Allow)."),
        "413": _error("Over the body limit, or preparing the request took too long."),
        "429": busy,
        "500": _error("An internal error (never a traceback)."),
        "503": unavailable,
    }
    out["405"]["headers"] = {"Allow": {"schema": {"type": "string"}}}
    if body:
        out["400"] = _error(
            "A malformed or invalid body (names the field), options.num_ctx above the "
            "served window, a prompt over the window, images, template/suffix/context."
        )
    return dict(sorted(out.items()))


def _json(schema: dict, description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


_STREAM = {
    "type": "string",
    "description": "NDJSON: one JSON object a line, `done: false` until the last, which "
    "has done_reason and the counts and durations (ns); an error after the stream opened "
    'is a line {"error": ...}.',
}


def add_paths(paths: dict[str, dict]) -> None:
    """Add Ollama's routes to `paths` (before openapi.py adds the layers' other errors and
    the preflights)."""

    def op(path, method, operation_id, summary, ok, body=None):
        operation = _operation(path, operation_id, summary, ok, body=body, tag="ollama")
        operation["responses"] = _responses(ok, body=body is not None)
        if path in ("/api/chat", "/api/generate"):
            operation["parameters"] = [
                {
                    "name": "X-Session-Id",
                    "in": "header",
                    "required": False,
                    "description": "The session whose cached conversation the turn resumes.",
                    "schema": {"type": "string", "maxLength": IDENTIFIER_MAX},
                }
            ]
        paths[path] = {method: operation}

    for path, kind, schema in (
        ("/api/chat", "Chat", "OllamaChatResponse"),
        ("/api/generate", "Generate", "OllamaGenerateResponse"),
    ):
        op(
            path,
            "post",
            f"ollama{kind}",
            f"Ollama {kind.lower()}: NDJSON lines (stream default true) or one object",
            {
                "description": "The answer (stream: false, or a load answer), or NDJSON.",
                "content": {JSON: {"schema": _ref(schema)}, NDJSON: {"schema": _STREAM}},
            },
            body=_ref(f"Ollama{kind}Request"),
        )
    op(
        "/api/embed",
        "post",
        "ollamaEmbed",
        "Ollama embeddings: L2-normalised, pooled as the model's `pooling`",
        _json(_ref("OllamaEmbedResponse"), "The embeddings, in input order."),
        body=_ref("OllamaEmbedRequest"),
    )
    op(
        "/api/embeddings",
        "post",
        "ollamaEmbeddings",
        "Ollama's older embeddings route: one prompt",
        _json(_ref("OllamaEmbeddingsResponse"), "The embedding."),
        body=_ref("OllamaEmbeddingsRequest"),
    )
    op(
        "/api/tags",
        "get",
        "ollamaTags",
        "The loaded models (and aliases), as Ollama lists them",
        _json(_ref("OllamaTags"), "The models."),
    )
    op(
        "/api/ps",
        "get",
        "ollamaPs",
        "The running models (every loaded one)",
        _json(_ref("OllamaPs"), "The models."),
    )
    op(
        "/api/show",
        "post",
        "ollamaShow",
        "A model's details, chat template, parameters and GGUF metadata",
        _json(_ref("OllamaShow"), "The model."),
        body=_ref("OllamaModelRequest"),
    )
    op(
        "/api/version",
        "get",
        "ollamaVersion",
        "The Ollama API level served, and Pantheon's build",
        _json(_ref("OllamaVersion"), "The version."),
    )
    for action in MANAGED:
        op(
            f"/api/{action}",
            managed_method(action).lower(),
            f"ollama{action.capitalize()}",
            f"Refused (403): {MANAGED[action]} is the operator's here (/admin/models/...)",
            _json(_ref("OllamaError"), "Never answered: every call is the 403."),
            body={"type": "object"},
        )
