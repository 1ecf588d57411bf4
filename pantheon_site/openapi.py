"""The OpenAPI 3.1 document of every route, served at GET /openapi.json.

Written as code rather than generated (drf-spectacular): the chat route and the session
routes are plain Django views that parse their JSON by hand, and /session/watch is a
Channels consumer, so a generator would see empty bodies. Each app describes its own
routes (`add_paths(paths)`, `schemas()` in wire/openapi.py (the meta and chat routes),
wire/anthropic/openapi.py, operators/openapi.py, sessions/openapi.py,
wire/responses/openapi.py, wire/completions/openapi.py, wire/llamacpp/openapi.py,
wire/ollama/openapi.py) with the
building blocks of pantheon_platform/openapi.py, whose `serializer_schema` reads a request
body's bounds from its serializer. This module puts the pieces together, adds what the
ASGI layers may answer before any view and the CORS preflights, and serves the document;
tests/wire/test_openapi.py keeps the paths and methods in step with the URL table.
"""

from __future__ import annotations

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

import observability.openapi as observability_openapi
import operators.openapi as operators_openapi
import sessions.openapi as sessions_openapi
import wire.anthropic.openapi as anthropic_openapi
import wire.batches.openapi as batches_openapi
import wire.completions.openapi as textapi_openapi
import wire.files.openapi as files_openapi
import wire.llamacpp.openapi as llamacpp_openapi
import wire.ollama.openapi as ollama_openapi
import wire.openapi as wire_openapi
import wire.responses.openapi as responses_openapi
from pantheon_platform import routes
from pantheon_platform.errors import json_response, method_not_allowed
from pantheon_platform.openapi import (
    ERRORS,
    JSON,
    METHODS,
    RETRY_AFTER,
    STRING,
    error_ref,
    obj,
    ok,
    operation,
    ref,
)

OPENAPI_VERSION = "3.1.0"
DEBUG_PATH = wire_openapi.DEBUG_PATH

# The pieces, in the document's order: (add_paths, schemas).
PIECES = (
    wire_openapi,  # /, /v1/models, /v1/chat/completions, /health, the /v1-less aliases
    operators_openapi,  # /admin/models, /admin/aliases, ...
    sessions_openapi,  # /admin/session/export, /session/...
    responses_openapi,  # /v1/responses, /v1/responses/{response_id}
    textapi_openapi,  # /v1/completions, /v1/embeddings, /tokenize, /detokenize
    llamacpp_openapi,  # /props, /slots, /completion, /infill (llama-server's)
    anthropic_openapi,  # /v1/messages, /v1/messages/count_tokens
    ollama_openapi,  # /api/chat, /api/generate, /api/tags, ... (Ollama's)
    files_openapi,  # /v1/files, /v1/files/{file_id}, /v1/files/{file_id}/content
    batches_openapi,  # /v1/batches, /v1/batches/{batch_id}, /v1/batches/{batch_id}/cancel
    observability_openapi,  # /metrics, /admin/stats
)


_ERROR = obj(
    {
        "error": obj(
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
                    "unsupported_media_type, not_supported_error (llama-server's /infill), ...",
                },
                # null but for an overflow (OpenAI's context_length_exceeded); llama.cpp's
                # shape on /health's 503 carries the status (503).
                "code": {"type": ["string", "integer", "null"]},
                "param": STRING,
            },
            ("message", "type", "code"),
            additionalProperties=True,
            description="Some types add fields, e.g. context_over_budget carries "
            "context_window and prompt_tokens (streamed, kv_used and kv_cap too); a 400 about one field names it in param "
            "(e.g. messages[0].content holding a lone surrogate).",
        )
    },
    ("error",),
)


def _responses_components() -> dict:
    out = {}
    for status, (name, description) in ERRORS.items():
        response = {"description": description, "content": {JSON: {"schema": ref("Error")}}}
        if status in (429, 503):
            response["headers"] = RETRY_AFTER
        if status == 405:
            response["headers"] = {"Allow": {"schema": STRING}}
        if status == 401:
            response["headers"] = {"WWW-Authenticate": {"schema": STRING}}
        out[name] = response
    return out


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
        responses.setdefault(str(status), error_ref(status))
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


def _paths(debug_routes: bool) -> dict[str, dict]:
    paths: dict[str, dict] = {
        "/openapi.json": {
            "get": operation(
                "/openapi.json",
                "openapi",
                "This document",
                ok(
                    obj(
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
    }
    for piece in PIECES:
        piece.add_paths(paths)
    if debug_routes:
        wire_openapi.add_debug_paths(paths)
    for path, item in paths.items():
        for method, op in item.items():
            if method in METHODS:
                _add_layer_errors(path, method, op)
        first = next(op for method, op in item.items() if method in METHODS)
        item["options"] = _preflight(first["operationId"])
    return paths


def _document(debug_routes: bool) -> dict:
    schemas = {"Error": _ERROR}
    for piece in PIECES:
        schemas.update(piece.schemas())
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
            "schemas": schemas,
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
