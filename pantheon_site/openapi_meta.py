"""The OpenAPI pieces of inference/meta_views.py's routes: GET /health (llama.cpp's
readiness check), GET /v1/models/{model_id}, and the spellings without /v1 that some
clients use (/models, /models/{model_id}, /chat/completions: the same operations).

pantheon_site/openapi.py calls add_paths() with its paths and merges schemas()."""

from __future__ import annotations

import copy

# The spellings without /v1: each documents the same operation as its /v1 route.
NO_V1_ALIASES = {
    "/models": "/v1/models",
    "/models/{model_id}": "/v1/models/{model_id}",
    "/chat/completions": "/v1/chat/completions",
}


def schemas() -> dict:
    from pantheon_site.openapi import _MODEL_ENTRY, _object

    return {
        "Model": _MODEL_ENTRY,
        "LlamaHealth": _object({"status": {"const": "ok"}}, ("status",)),
    }


def add_paths(paths: dict[str, dict]) -> None:
    """Add /health, /v1/models/{model_id} and the /v1-less aliases to `paths` (before
    openapi.py adds the layers' errors and the preflights)."""
    from pantheon_site.openapi import METHODS, _ok, _operation, _ref

    paths["/health"] = {
        "get": _operation(
            "/health",
            "llamaHealth",
            "Readiness, as llama.cpp's /health: 200 {status: ok} once a model is loaded "
            "and none is loading; 503 in llama.cpp's shape ({error: {code: 503, message, "
            'type: "unavailable_error"}}) while the server starts or a model loads '
            '("Loading model"), with nothing loaded ("No model loaded"), or while it '
            'drains for shutdown ("Shutting down")',
            _ok(_ref("LlamaHealth")),
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
        "get": _operation(
            "/v1/models/{model_id}",
            "retrieveModel",
            "One served model: its /v1/models row. An alias stands for its target; an id "
            "that names no served model is 404 model_not_found (even with one loaded)",
            _ok(_ref("Model")),
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
