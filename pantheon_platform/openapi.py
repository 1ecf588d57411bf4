"""The building blocks of the OpenAPI 3.1 document, shared by every app's piece of it.

Each app describes its own routes in its own `openapi.py` (inference, wire.anthropic,
operators, sessions, wire.responses) with `add_paths(paths)` and `schemas()`;
pantheon_site/openapi.py puts them together, adds what the ASGI layers answer before any
view, the preflights, and serves the document at GET /openapi.json.

Request bodies validated by a DRF serializer are not re-typed: `serializer_schema` reads
the serializer's fields (type, null, required, min/max, lengths, choices, the list bounds
kept in settings, help_text as the description), so a bound changed in a validator changes
the document with it. A field of our own that DRF cannot describe (StopField,
LogitBiasField, ...) says what it takes with an `openapi_schema()` method.
"""

from __future__ import annotations

from typing import Any

from django.conf import settings
from rest_framework import serializers

from pantheon_platform import routes
from pantheon_platform.strict_json import INT64_BOUND, BoundedListField
from pantheon_platform.tenancy import SESSION_ID_MAX

JSON = "application/json"
SSE = "text/event-stream"
# The HTTP methods an OpenAPI path item may hold an operation for.
METHODS = ("get", "put", "post", "delete", "options", "head", "patch", "trace")

INT = {"type": "integer"}
NON_NEGATIVE = {"type": "integer", "minimum": 0}
NUMBER = {"type": "number"}
# What a request's integer (and unbounded number) fields take: |value| < 2**64.
INT64 = {"type": "integer", "minimum": 1 - INT64_BOUND, "maximum": INT64_BOUND - 1}
FINITE = {"type": "number", "exclusiveMinimum": -INT64_BOUND, "exclusiveMaximum": INT64_BOUND}
STRING = {"type": "string"}
BOOL = {"type": "boolean"}
RETRY_AFTER = {"Retry-After": {"schema": {"type": "integer", "minimum": 1}}}
# How far a model load has got (engine.loading.progress.LoadProgress.as_dict):
# on GET / and on /admin/models' loading rows.
LOAD_PROGRESS = {
    "type": "object",
    "properties": {
        "phase": {"type": "string", "enum": ["parse", "map", "dequantise", "cache_write"]},
        "tensors_done": NON_NEGATIVE,
        "tensors_total": NON_NEGATIVE,
        "bytes_done": {**NON_NEGATIVE, "description": "Of the tensors' bytes in the file."},
        "bytes_total": NON_NEGATIVE,
        "fraction": {"type": "number", "minimum": 0, "maximum": 1},
    },
    "required": ["phase", "tensors_done", "tensors_total", "bytes_done", "bytes_total", "fraction"],
}

# status -> (component name, description): the error responses every piece refers to.
ERRORS = {
    400: (
        "BadRequest",
        "invalid_request_error: an empty, malformed or invalid body or query; "
        "context_over_budget (code context_length_exceeded, with context_window and "
        "prompt_tokens): the prompt is longer than the window; not_supported_error: "
        "llama-server's /infill on a model without FIM tokens; on a model "
        "load, load_failed for an option this server cannot honour or a GGUF architecture "
        "it does not implement (named, with the supported ones).",
    ),
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


def ref(name: str) -> dict:
    return {"$ref": f"#/components/schemas/{name}"}


def error_ref(status: int) -> dict:
    return {"$ref": f"#/components/responses/{ERRORS[status][0]}"}


def nullable(schema: dict) -> dict:
    """`schema` or null (JSON Schema 2020-12: OpenAPI 3.1 has no `nullable`)."""
    return {"anyOf": [schema, {"type": "null"}]}


def obj(properties: dict, required: tuple = (), **extra: Any) -> dict:
    """An object schema: its properties, the required ones, and anything else given."""
    schema = {"type": "object", "properties": properties, **extra}
    if required:
        schema["required"] = list(required)
    return schema


# Where each layer's attention runs, for a model on dies (omitted elsewhere, and until a
# forward pass has reached its layers): ondie + host == total; host > 0 means degraded.
# /v1/models carries these keys, /admin/models the operator's extended object.
ATTENTION = obj(
    {"ondie": NON_NEGATIVE, "host": NON_NEGATIVE, "total": NON_NEGATIVE},
    ("ondie", "host", "total"),
)


# CUDA-graph residency of a model's decode steps (omitted when it has no graph slots, or
# none was exercised yet): failed > 0 costs speed, never correctness.
GRAPHS = obj(
    {
        "live": NON_NEGATIVE,
        "total": NON_NEGATIVE,
        "failed": NON_NEGATIVE,
        "ineligible": NON_NEGATIVE,
        "pending": NON_NEGATIVE,
    },
    ("live", "total", "failed", "ineligible", "pending"),
)


def sse_event(description: str) -> dict:
    """The schema of a text/event-stream response: one event, as its fields (`event`,
    `data`, `id`, `retry`). Each event of a stream is checked against it (OpenAPI 3.2's
    itemSchema; schemathesis reads a 3.1 `schema` on text/event-stream the same way), so
    it is an object, not the stream's text."""
    return {
        "type": "object",
        "properties": {"event": STRING, "data": STRING, "id": STRING, "retry": NON_NEGATIVE},
        "description": description,
    }


def ok(schema: dict, description: str = "OK") -> dict:
    return {"description": description, "content": {JSON: {"schema": schema}}}


def operation(
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
    pantheon_site.openapi, which knows the method)."""
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
        op["responses"][str(status)] = error_ref(status)
    if body is not None:
        op["requestBody"] = {"required": True, "content": {JSON: {"schema": body}}}
    if parameters:
        op["parameters"] = parameters
    return op


def session_header() -> dict:
    return {
        "name": "X-Session-Id",
        "in": "header",
        "required": False,
        "description": "The session id when the body (or query) gives none.",
        "schema": {"type": "string", "maxLength": SESSION_ID_MAX},
    }


def query(name: str, schema: dict, required: bool = False, description: str = "") -> dict:
    param = {"name": name, "in": "query", "required": required, "schema": schema}
    if description:
        param["description"] = description
    return param


# --- request schemas from the validators ---------------------------------------------------


def _bounds(schema: dict, field) -> dict:
    """min_value/max_value as the field's range (the 64-bit bound where it gives none)."""
    low, high = getattr(field, "min_value", None), getattr(field, "max_value", None)
    exclusive_low = getattr(field, "exclusive_min", None)
    if schema["type"] == "integer":
        schema["minimum"] = max(low, 1 - INT64_BOUND) if low is not None else 1 - INT64_BOUND
        schema["maximum"] = min(high, INT64_BOUND - 1) if high is not None else INT64_BOUND - 1
        return schema
    if exclusive_low is not None:
        schema["exclusiveMinimum"] = exclusive_low
    elif low is not None:
        schema["minimum"] = low
    else:
        schema["exclusiveMinimum"] = -INT64_BOUND
    if high is not None:
        schema["maximum"] = high
    else:
        schema["exclusiveMaximum"] = INT64_BOUND
    return schema


def field_schema(field: serializers.Field) -> dict:
    """The JSON schema of what one DRF field accepts (null included where it allows it),
    read from the field itself: its type, range, lengths, choices and help_text."""
    own = getattr(field, "openapi_schema", None)
    if own is not None:
        schema = own()
    elif isinstance(field, serializers.BooleanField):
        schema = dict(BOOL)
    elif isinstance(field, serializers.IntegerField):
        schema = _bounds({"type": "integer"}, field)
    elif isinstance(field, serializers.FloatField):
        schema = _bounds({"type": "number"}, field)
    elif isinstance(field, serializers.ChoiceField):
        schema = {"enum": list(field.choices)}
    elif isinstance(field, serializers.CharField):
        schema = {"type": "string"}
        if field.max_length is not None:
            schema["maxLength"] = field.max_length
        least = field.min_length or 0
        if not field.allow_blank:
            least = max(least, 1)
            if field.trim_whitespace:
                schema["pattern"] = r"\S"  # blank once trimmed is refused too
        if least:
            schema["minLength"] = least
    elif isinstance(field, serializers.ListField):
        schema = {"type": "array", "items": field_schema(field.child)}
        if isinstance(field, BoundedListField):
            schema["maxItems"] = getattr(settings, field.setting)
        elif field.max_length is not None:
            schema["maxItems"] = field.max_length
        if not field.allow_empty:
            schema["minItems"] = 1
        elif field.min_length:
            schema["minItems"] = field.min_length
    elif isinstance(field, serializers.DictField):
        schema = {"type": "object"}
    elif isinstance(field, serializers.Serializer):
        schema = serializer_schema(field, additionalProperties=True)
    else:  # JSONField and the like: any JSON value
        schema = {}
    if field.help_text:
        schema["description"] = str(field.help_text)
    return nullable(schema) if field.allow_null else schema


def serializer_schema(serializer, **extra: Any) -> dict:
    """The object schema of a serializer's body: every field's schema, the required ones
    listed. `serializer` is the class or an instance."""
    fields = (serializer() if isinstance(serializer, type) else serializer).fields
    properties = {name: field_schema(field) for name, field in fields.items()}
    required = tuple(name for name, field in fields.items() if field.required)
    return obj(properties, required, **extra)
