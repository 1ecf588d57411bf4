"""The OpenAPI pieces of Ollama's API (wire/ollama): /api/chat, /api/generate,
/api/embed, /api/embeddings, /api/tags, /api/ps, /api/show, /api/version, and the model
management routes every call of which is refused (/api/pull, /push, /create, /delete,
/copy). The bounds are the parser's (wire/ollama/request.py) and the settings it reads.

The routes' own errors have Ollama's shape ({"error": "message"}); what the ASGI layers
answer before a route (key, Host, Origin, body limit) has the server's.

pantheon_site/openapi.py calls add_paths() with its paths and merges schemas()."""

from __future__ import annotations

from pantheon_platform.openapi import (
    BOOL,
    JSON,
    NON_NEGATIVE,
    NUMBER,
    STRING,
)
from pantheon_platform.openapi import RETRY_AFTER as _RETRY_AFTER
from pantheon_platform.openapi import obj as _object
from pantheon_platform.openapi import operation as _operation
from pantheon_platform.strict_json import IDENTIFIER_MAX
from wire.ollama.conversation import TOOL_CALL
from wire.ollama.render import NDJSON
from wire.ollama.request import CHAT, EMBED, EMBEDDINGS, GENERATE, SHOW
from wire.ollama.views import MANAGED, managed_method
from wire.openai_chat.openapi import TOOL_CALL_ERROR


def _ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def schemas() -> dict:
    """The request bodies are the parser's tables (wire/ollama/request.py); the answers
    are typed here."""
    call = TOOL_CALL.schema()
    durations = {
        "done": BOOL,
        "done_reason": STRING,
        "total_duration": NON_NEGATIVE,
        "load_duration": NON_NEGATIVE,
        "prompt_eval_count": NON_NEGATIVE,
        "prompt_eval_duration": NON_NEGATIVE,
        "eval_count": NON_NEGATIVE,
        "eval_duration": NON_NEGATIVE,
        "tool_call_error": TOOL_CALL_ERROR,
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
        "OllamaChatRequest": CHAT.schema(additionalProperties=True),
        "OllamaGenerateRequest": GENERATE.schema(additionalProperties=True),
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
        "OllamaEmbedRequest": EMBED.schema(additionalProperties=True),
        "OllamaEmbeddingsRequest": EMBEDDINGS.schema(additionalProperties=True),
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
        "OllamaModelRequest": SHOW.schema(additionalProperties=True),
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
