"""The OpenAPI pieces of the OpenAI Responses routes (wire.responses): POST /v1/responses,
GET and DELETE /v1/responses/{response_id}, GET /v1/responses/{response_id}/input_items. The bounds are wire.responses.request's.

pantheon_site/openapi.py calls add_paths() with its paths and merges schemas()."""

from __future__ import annotations

from pantheon_platform.openapi import (
    BOOL,
    JSON,
    NON_NEGATIVE,
    NUMBER,
    SSE,
    STRING,
    nullable,
    obj,
    ok,
    operation,
    ref,
    session_header,
    sse_event,
)
from wire.openai_chat.openapi import TOOL_CALL_ERROR
from wire.responses.request import REQUEST

RESPONSES_PATH = "/v1/responses"
RESPONSE_PATH = "/v1/responses/{response_id}"
INPUT_ITEMS_PATH = "/v1/responses/{response_id}/input_items"


def schemas() -> dict:
    """The request body is the parser's table (wire/responses/request.py); the answers
    are typed here."""
    request = REQUEST.schema(additionalProperties=True)
    output_text = obj(
        {"type": {"const": "output_text"}, "text": STRING, "annotations": {"type": "array"}},
        ("type", "text", "annotations"),
    )
    item_status = {"enum": ["in_progress", "completed", "incomplete"]}
    output_item = {
        "anyOf": [
            obj(
                {
                    "id": STRING,
                    "type": {"const": "message"},
                    "role": {"const": "assistant"},
                    "status": item_status,
                    "content": {"type": "array", "items": output_text},
                },
                ("id", "type", "role", "status", "content"),
            ),
            obj(
                {
                    "id": STRING,
                    "type": {"const": "function_call"},
                    "call_id": STRING,
                    "name": STRING,
                    "arguments": STRING,
                    "status": item_status,
                },
                ("id", "type", "call_id", "name", "arguments", "status"),
            ),
            obj(
                {
                    "id": STRING,
                    "type": {"const": "reasoning"},
                    "summary": {"type": "array"},
                    "content": {"type": "array"},
                    "status": item_status,
                },
                ("id", "type", "summary"),
            ),
        ]
    }
    usage = obj(
        {
            "input_tokens": NON_NEGATIVE,
            "input_tokens_details": obj(
                {"cached_tokens": NON_NEGATIVE, "cache_write_tokens": NON_NEGATIVE},
                ("cached_tokens",),
            ),
            "output_tokens": NON_NEGATIVE,
            "output_tokens_details": obj({"reasoning_tokens": NON_NEGATIVE}, ("reasoning_tokens",)),
            "total_tokens": NON_NEGATIVE,
            "truncated_messages": {
                **NON_NEGATIVE,
                "description": 'Messages `truncation: "auto"` dropped to fit (present when any).',
            },
        },
        ("input_tokens", "input_tokens_details", "output_tokens", "total_tokens"),
    )
    response = obj(
        {
            "id": STRING,
            "object": {"const": "response"},
            "created_at": NUMBER,
            "status": {"enum": ["completed", "incomplete", "in_progress", "failed"]},
            "incomplete_details": nullable(
                obj({"reason": {"const": "max_output_tokens"}}, ("reason",))
            ),
            "model": STRING,
            "output": {"type": "array", "items": output_item},
            "usage": nullable(usage),
            "tool_call_error": TOOL_CALL_ERROR,
            "previous_response_id": nullable(STRING),
            "instructions": nullable(STRING),
            "store": {
                **BOOL,
                "description": "false also when the response was too large to store "
                "(PANTHEON_RESPONSES_MAX_ITEM_BYTES): answered, not kept.",
            },
            "metadata": {"type": "object"},
        },
        ("id", "object", "created_at", "status", "model", "output"),
    )
    return {
        "ResponsesRequest": request,
        "Response": response,
        "ResponseDeleted": obj(
            {"id": STRING, "object": {"const": "response.deleted"}, "deleted": {"const": True}},
            ("id", "object", "deleted"),
        ),
        "ResponseInputItemList": _input_items(output_text, item_status),
        "ResponseStreamEvent": obj(
            {"type": STRING, "sequence_number": NON_NEGATIVE, "response": ref("Response")},
            ("type", "sequence_number"),
        ),
    }


def _input_items(output_text: dict, item_status: dict) -> dict:
    """GET /v1/responses/{id}/input_items' page (wire/responses/input_items.py)."""
    input_text = obj({"type": {"const": "input_text"}, "text": STRING}, ("type", "text"))
    item = {
        "anyOf": [
            obj(
                {
                    "id": STRING,
                    "type": {"const": "message"},
                    "role": {"enum": ["user", "system", "assistant"]},
                    "status": item_status,
                    "content": {"type": "array", "items": {"anyOf": [input_text, output_text]}},
                },
                ("id", "type", "role", "content"),
            ),
            obj(
                {
                    "id": STRING,
                    "type": {"const": "function_call"},
                    "call_id": STRING,
                    "name": STRING,
                    "arguments": STRING,
                    "status": item_status,
                },
                ("id", "type", "call_id", "name", "arguments"),
            ),
            obj(
                {
                    "id": STRING,
                    "type": {"const": "function_call_output"},
                    "call_id": STRING,
                    "output": STRING,
                    "status": item_status,
                },
                ("id", "type", "call_id", "output"),
            ),
        ]
    }
    return obj(
        {
            "object": {"const": "list"},
            "data": {"type": "array", "items": item},
            "first_id": nullable(STRING),
            "last_id": nullable(STRING),
            "has_more": BOOL,
        },
        ("object", "data", "first_id", "last_id", "has_more"),
    )


def add_paths(paths: dict[str, dict]) -> None:
    """Add the Responses routes to `paths` (before openapi.py adds the layers' errors
    and the preflights)."""
    paths[RESPONSES_PATH] = {
        "post": operation(
            RESPONSES_PATH,
            "createResponse",
            "OpenAI Responses API: a response (JSON), or (stream: true) its events "
            "(`event: <type>` and `data: {type, sequence_number, ...}`: response.created "
            "... response.completed or response.incomplete; an `error` event and "
            "response.failed when generation fails after the stream opened). Stored "
            "(store: true, the default) for GET and previous_response_id, within the "
            "per-key count, byte and age limits (the oldest evicted first).",
            {
                "description": "The response, or its event stream.",
                "content": {
                    JSON: {"schema": ref("Response")},
                    SSE: {
                        "schema": sse_event(
                            "Server-sent events, each with its `event:` line: "
                            "response.created, response.output_item.added, "
                            "response.output_text.delta, "
                            "response.function_call_arguments.delta, ..., "
                            "response.completed."
                        )
                    },
                },
            },
            (400, 404, 413, 429, 503),
            body=ref("ResponsesRequest"),
            parameters=[session_header()],
            tag="client",
        )
    }
    response_id = {
        "name": "response_id",
        "in": "path",
        "required": True,
        "description": "A stored response's id (resp_...), made with the caller's key.",
        "schema": {"type": "string", "minLength": 1},
    }
    paths[RESPONSE_PATH] = {
        "parameters": [response_id],
        "get": operation(
            RESPONSE_PATH,
            "retrieveResponse",
            "A stored response, as created (404 for another key's, or one not stored, "
            "evicted or expired)",
            ok(ref("Response")),
            (404,),
            tag="client",
        ),
        "delete": operation(
            RESPONSE_PATH,
            "deleteResponse",
            "Delete a stored response (404 for another key's, or one not stored, evicted "
            "or expired)",
            ok(ref("ResponseDeleted")),
            (404,),
            tag="client",
        ),
    }
    query = [
        {
            "name": "limit",
            "in": "query",
            "required": False,
            "description": "Items per page, 1 to 100 (default 20).",
            "schema": {"type": "integer", "minimum": 1, "maximum": 100},
        },
        {
            "name": "order",
            "in": "query",
            "required": False,
            "description": "desc (the newest first, the default) or asc.",
            "schema": {"type": "string", "enum": ["asc", "desc"]},
        },
        {
            "name": "after",
            "in": "query",
            "required": False,
            "description": "An item id of this response: the items after it (in `order`).",
            "schema": {"type": "string"},
        },
    ]
    paths[INPUT_ITEMS_PATH] = {
        "parameters": [response_id],
        "get": operation(
            INPUT_ITEMS_PATH,
            "listResponseInputItems",
            "The input items a stored response answered (a continued response's earlier "
            "turns included, instructions not), a page at a time; 404 as for GET "
            "/v1/responses/{response_id}",
            ok(ref("ResponseInputItemList")),
            (400, 404),
            parameters=query,
            tag="client",
        ),
    }
