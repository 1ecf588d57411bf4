"""GET /openapi.json: a valid OpenAPI 3.1 document whose paths and methods are exactly
the URL table's (Django's resolver plus the Channels routes in pantheon_site/stack.py).

A route added, removed or given another method without the document following fails
here (the Lemonade seed's /internal/routes idea: the route table is the source)."""

from __future__ import annotations

import asyncio
import re

import pytest
from django.test import Client, override_settings
from django.urls import URLPattern, URLResolver, get_resolver
from openapi_spec_validator import validate

from pantheon_site import openapi, stack

PROBED = ("GET", "POST", "PUT", "PATCH", "DELETE")
# Not API routes: the Django admin (its own HTML pages) and its redirect.
UNDOCUMENTED_PREFIXES = ("/console",)


@pytest.fixture
def http() -> Client:
    return Client(enforce_csrf_checks=True)


def _route_text(pattern) -> str:
    """A URL pattern's route as written: `admin/aliases/<path:alias>`, or a regex."""
    return str(pattern.pattern)


def _openapi_path(route: str) -> str:
    """Django's route syntax to OpenAPI's: `<path:alias>` -> `{alias}`."""
    return "/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", route)


def django_routes(patterns=None, prefix: str = "") -> dict[str, object]:
    """Every route of the URL table: OpenAPI path -> its pattern, through includes. The
    catch-all 404 (`^`) is not a route."""
    if patterns is None:
        patterns = get_resolver().url_patterns
    out: dict[str, object] = {}
    for entry in patterns:
        text = _route_text(entry)
        if isinstance(entry, URLResolver):
            out.update(django_routes(entry.url_patterns, prefix + text))
            continue
        assert isinstance(entry, URLPattern)
        if text == "^":  # the catch-all: every other path is the JSON 404
            continue
        path = _openapi_path(prefix + text)
        if path.startswith(UNDOCUMENTED_PREFIXES):
            continue
        out[path] = entry
    return out


def channels_routes(monkeypatch) -> dict[str, object]:
    """The HTTP routes the Channels router holds in front of Django (stack.build), without
    the ASGI layers around it. Its catch-through to Django (`re_path("")`) is not a route."""
    monkeypatch.setattr(stack, "wrap", lambda app: app)
    router = stack.build(lambda scope, receive, send: None)
    out = {}
    for route in router.application_mapping["http"].routes:
        text = _route_text(route)
        if text in ("", "^"):
            continue
        out[_openapi_path(text)] = route
    return out


def documented_methods(item: dict) -> set[str]:
    return {m.upper() for m in item if m in openapi.METHODS} - {"OPTIONS"}


def _concrete(path: str) -> str:
    return re.sub(r"\{\w+\}", "no-such-alias", path)


def django_allowed_methods(http: Client, path: str) -> set[str]:
    """The methods a route answers without 405 (with nothing loaded and an empty JSON
    body every route refuses with a 4xx, so probing changes nothing)."""
    allowed = set()
    for method in PROBED:
        response = http.generic(method, _concrete(path), b"{}", content_type="application/json")
        assert response.status_code != 500, (method, path, response.content)
        if response.status_code != 405:
            allowed.add(method)
    return allowed


def channels_allowed_methods(route) -> set[str]:
    """The same probe, through the route's consumer (ASGI), outside Django."""
    from channels.testing import HttpCommunicator

    async def probe(method: str) -> int:
        communicator = HttpCommunicator(route.callback, method, str(route.pattern), b"")
        response = await communicator.get_response(timeout=5)
        return response["status"]

    allowed = set()
    for method in PROBED:
        status = asyncio.run(probe(method))
        assert status != 500, (method, route.pattern)
        if status != 405:
            allowed.add(method)
    return allowed


def test_the_document_is_valid_openapi():
    validate(openapi.document())
    validate(openapi._document(True))


def test_get_openapi_json_serves_the_document(http):
    response = http.get("/openapi.json")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert response.json() == openapi.document()
    assert response.json()["openapi"].startswith("3.1")


def test_openapi_json_answers_get_only(http):
    response = http.post("/openapi.json", b"{}", content_type="application/json")
    assert response.status_code == 405
    assert response.json()["error"]["type"] == "method_not_allowed"
    assert response["Allow"] == "GET, OPTIONS"


def test_paths_are_the_url_tables(monkeypatch, empty_runtime):
    table = {**django_routes(), **channels_routes(monkeypatch)}
    documented = set(openapi.document()["paths"])
    # The debug hook is in the document only when it is served (PANTHEON_DEBUG_ROUTES).
    assert openapi.DEBUG_PATH in table
    assert set(table) - {openapi.DEBUG_PATH} == documented
    assert set(table) == set(openapi._document(True)["paths"])


def test_methods_are_what_each_route_answers(http, monkeypatch, empty_runtime, db):
    # db: GET /admin/stats reads the usage stats
    paths = openapi.document()["paths"]
    channels = channels_routes(monkeypatch)
    for path in django_routes():
        if path == openapi.DEBUG_PATH:
            continue
        assert django_allowed_methods(http, path) == documented_methods(paths[path]), path
    for path, route in channels.items():
        assert channels_allowed_methods(route) == documented_methods(paths[path]), path


@override_settings(PANTHEON_DEBUG_ROUTES=True)
def test_the_debug_route_when_enabled(http, empty_runtime):
    paths = openapi.document()["paths"]
    assert openapi.DEBUG_PATH in paths
    allowed = django_allowed_methods(http, openapi.DEBUG_PATH)
    assert allowed == documented_methods(paths[openapi.DEBUG_PATH])


def test_the_debug_route_when_disabled_is_absent_and_404(http, empty_runtime):
    assert openapi.DEBUG_PATH not in openapi.document()["paths"]
    assert http.post(openapi.DEBUG_PATH, b"{}", content_type="application/json").status_code == 404


def test_every_path_documents_the_preflight(http):
    for path, item in openapi.document()["paths"].items():
        assert "options" in item, path
        response = http.options(_concrete(path))
        assert response.status_code == 200 and response.json() == {}, path


def test_every_operation_documents_its_errors():
    """Its own, and what the ASGI layers answer before any view: 403 (Host, Origin) and
    413 everywhere; 401/429/503 from the key check on keyed routes; 415 for a non-JSON
    body to a management route. Every error response is the Error schema."""
    from pantheon_platform import routes

    doc = openapi.document()
    for path, item in doc["paths"].items():
        for method, op in item.items():
            if method not in openapi.METHODS or method == "options":
                continue
            codes = set(op["responses"])
            assert codes & {"200", "202"}, (method, path)  # 202: POST /admin/shutdown
            assert {"403", "413", "500"} <= codes, (method, path)
            keyed = op["x-pantheon-scope"] != routes.OPEN
            assert op["x-pantheon-scope"] == routes.scope_for(path)
            if keyed:
                assert {"401", "429", "503"} <= codes, (method, path)
                assert {"bearer": [op["x-pantheon-scope"]]} in op["security"]
                assert {} in op["security"], "keys are optional"
            else:
                assert op["security"] == [] and "401" not in codes, (method, path)
            body_method = method in ("post", "put", "patch", "delete")
            assert ("415" in codes) == (body_method and routes.is_management(path)), path
            if "requestBody" in op or any(p["in"] == "query" for p in op.get("parameters", [])):
                assert "400" in codes, (method, path)
            for code, response in op["responses"].items():
                if code.startswith(("4", "5")):
                    if path.startswith("/v1/messages") and "$ref" not in response:
                        # The route's own errors have Anthropic's shape (the layers' not).
                        schema = response["content"]["application/json"]["schema"]
                        assert "#/components/schemas/AnthropicError" in str(schema), path
                        continue
                    if path.startswith("/api/") and "$ref" not in response:
                        # Ollama's routes: {"error": "message"} (the layers' in ours).
                        schema = response["content"]["application/json"]["schema"]
                        assert "#/components/schemas/OllamaError" in str(schema), path
                        continue
                    name = response["$ref"].rsplit("/", 1)[1]
                    schema = doc["components"]["responses"][name]["content"]["application/json"]
                    assert schema["schema"] == {"$ref": "#/components/schemas/Error"}


def test_request_bounds_follow_the_settings(settings):
    settings.PANTHEON_MAX_MESSAGES = 7
    settings.PANTHEON_MAX_TOOLS = 3
    chat = openapi.document()["components"]["schemas"]["ChatCompletionRequest"]
    assert chat["properties"]["messages"]["maxItems"] == 7
    assert chat["properties"]["tools"]["anyOf"][0]["maxItems"] == 3


def test_the_chat_request_schema_is_read_from_its_serializer(monkeypatch):
    """The chat body's bounds are the validator's own: a range changed on the serializer's
    field changes the document with it (nothing is typed twice)."""
    from wire.openai_chat.request import ChatCompletionRequest

    # A serializer's fields are built anew from their declared arguments for each instance.
    declared = ChatCompletionRequest._declared_fields
    monkeypatch.setitem(declared["temperature"]._kwargs, "max_value", 5.0)
    monkeypatch.setitem(declared["n"]._kwargs, "min_value", 2)
    monkeypatch.setitem(declared["session_id"]._kwargs, "max_length", 17)
    props = openapi.document()["components"]["schemas"]["ChatCompletionRequest"]["properties"]
    assert props["temperature"]["anyOf"][0]["maximum"] == 5.0
    assert props["n"]["anyOf"][0]["minimum"] == 2
    assert props["session_id"]["anyOf"][0]["maxLength"] == 17
    # Every bound a field declares is in the document, and every field is documented.
    assert set(props) == set(ChatCompletionRequest().fields)
    for name, field in ChatCompletionRequest().fields.items():
        schema = props[name]["anyOf"][0] if field.allow_null else props[name]
        if getattr(field, "min_value", None) is not None:
            assert schema["minimum"] == field.min_value, name
        if getattr(field, "max_value", None) is not None:
            assert schema["maximum"] == field.max_value, name
        if getattr(field, "max_length", None) is not None:
            assert schema["maxLength"] == field.max_length, name


def test_field_schemas_say_what_each_field_takes():
    from rest_framework import serializers

    from pantheon_platform.openapi import INT64, field_schema, serializer_schema
    from pantheon_platform.strict_json import (
        StrictBooleanField,
        StrictCharField,
        StrictFloatField,
        StrictIntegerField,
    )

    assert field_schema(StrictIntegerField()) == INT64
    assert field_schema(StrictIntegerField(min_value=0, max_value=9, allow_null=True)) == {
        "anyOf": [{"type": "integer", "minimum": 0, "maximum": 9}, {"type": "null"}]
    }
    assert field_schema(StrictFloatField(exclusive_min=0.0, max_value=2.0)) == {
        "type": "number",
        "exclusiveMinimum": 0.0,
        "maximum": 2.0,
    }
    assert field_schema(StrictBooleanField(help_text="why")) == {
        "type": "boolean",
        "description": "why",
    }
    # Blank refused (trimmed first): at least one non-space character.
    assert field_schema(StrictCharField(max_length=4)) == {
        "type": "string",
        "maxLength": 4,
        "minLength": 1,
        "pattern": r"\S",
    }
    assert field_schema(StrictCharField(allow_blank=True)) == {"type": "string"}
    assert field_schema(serializers.ChoiceField(("a", "b"))) == {"enum": ["a", "b"]}
    listed = serializers.ListField(child=StrictIntegerField(min_value=0, max_value=3), max_length=2)
    assert field_schema(listed) == {
        "type": "array",
        "items": {"type": "integer", "minimum": 0, "maximum": 3},
        "maxItems": 2,
    }

    class Body(serializers.Serializer):
        name = StrictCharField(allow_blank=True)
        flag = StrictBooleanField(required=False)

    assert serializer_schema(Body) == {
        "type": "object",
        "properties": {"name": {"type": "string"}, "flag": {"type": "boolean"}},
        "required": ["name"],
    }


def test_the_load_request_schema_is_read_from_its_serializer(monkeypatch):
    from operators.serializers import LoadRequest

    monkeypatch.setitem(LoadRequest._declared_fields["ctx_cap"]._kwargs, "max_value", 99)
    load = openapi.document()["components"]["schemas"]["LoadRequest"]
    assert load["properties"]["ctx_cap"]["anyOf"][0]["maximum"] == 99
    assert load["required"] == ["path"]


def _strings(schema, path: str = "") -> list[tuple[str, dict]]:
    """Every string schema in `schema`, with where it is."""
    found = []
    if isinstance(schema, dict):
        if schema.get("type") == "string":
            found.append((path, schema))
        for key, value in schema.items():
            found += _strings(value, f"{path}/{key}")
    elif isinstance(schema, list):
        for i, value in enumerate(schema):
            found += _strings(value, f"{path}/{i}")
    return found


def test_every_responses_text_field_shows_its_bound():
    """The Responses request's strings are all bounded, as the parser bounds them:
    the texts (whether or not they reach the prompt) by TEXT_MAX, names and ids tighter."""
    from wire.fields import TEXT_MAX
    from wire.responses.request import METADATA_VALUE_MAX, TOOL_NAME_MAX

    schema = openapi.document()["components"]["schemas"]["ResponsesRequest"]
    strings = _strings(schema)
    assert strings and all("maxLength" in s for _, s in strings), [
        where for where, s in strings if "maxLength" not in s
    ]
    props = schema["properties"]
    assert props["instructions"]["anyOf"][0]["maxLength"] == TEXT_MAX
    json_schema = props["text"]["anyOf"][0]["properties"]["format"]["anyOf"][0]["anyOf"][1]
    assert json_schema["properties"]["description"]["anyOf"][0]["maxLength"] == TEXT_MAX
    assert json_schema["properties"]["name"]["maxLength"] == 64
    tool = props["tools"]["anyOf"][0]["items"]["properties"]
    assert tool["description"]["anyOf"][0]["maxLength"] == TEXT_MAX
    assert tool["name"]["maxLength"] == TOOL_NAME_MAX
    call = props["input"]["anyOf"][1]["items"]["anyOf"][1]["properties"]
    assert call["arguments"]["maxLength"] == TEXT_MAX
    metadata = props["metadata"]["anyOf"][0]
    assert metadata["additionalProperties"]["maxLength"] == METADATA_VALUE_MAX
    stats = openapi.document()["components"]["schemas"]["UsageStats"]["properties"]
    assert set(stats["stored_responses"]["properties"]["limits"]["properties"]) == {
        "max_item_bytes",
        "max_bytes_per_key",
        "max_per_key",
        "ttl_s",
    }
