"""The OpenAPI piece of wire/urls.py's own routes (pantheon_site/openapi.py puts the
document together): the meta routes' (wire/meta/openapi.py) and the chat route's
(wire/openai_chat/openapi.py), and the spellings without /v1 that some clients use
(/models, /models/{model_id}, /chat/completions: the same operations).

The other formats' routes have their own pieces (wire/anthropic/openapi.py, ...)."""

from __future__ import annotations

import copy

from pantheon_platform.openapi import METHODS
from wire.meta import openapi as meta
from wire.openai_chat import openapi as chat

DEBUG_PATH = meta.DEBUG_PATH
add_debug_paths = meta.add_debug_paths

# The document lists these paths in this order (as it always has); any other path of the
# pieces follows them.
PATH_ORDER = ("/", "/v1/models", "/v1/chat/completions", "/health", "/v1/models/{model_id}")
# The spellings without /v1: each documents the same operation as its /v1 route.
NO_V1_ALIASES = {
    "/models": "/v1/models",
    "/models/{model_id}": "/v1/models/{model_id}",
    "/chat/completions": "/v1/chat/completions",
}


def schemas() -> dict:
    return {**chat.schemas(), **meta.schemas()}


def add_paths(paths: dict[str, dict]) -> None:
    """Add the routes of wire/urls.py (but the text API's, Ollama's, Anthropic's and the
    Responses API's, which have their own pieces) to `paths`."""
    items = {**meta.path_items(), **chat.path_items()}
    for path in PATH_ORDER:
        paths[path] = items.pop(path)
    paths.update(items)
    for alias, target in NO_V1_ALIASES.items():
        item = copy.deepcopy(paths[target])
        for method, op in item.items():
            if method not in METHODS:
                continue
            op["operationId"] += "NoV1"
            op["summary"] = f"{target} without /v1 (some clients' base URL): {op['summary']}"
        paths[alias] = item
