"""The OpenAPI pieces of the OpenAI Responses routes (wire.responses): POST /v1/responses,
GET and DELETE /v1/responses/{response_id}. The bounds are wire.responses.request's.

pantheon_site/openapi.py calls add_paths() with its paths and merges schemas()."""

from __future__ import annotations

from django.conf import settings

from pantheon_platform.openapi import (
    BOOL,
    INT64,
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
from pantheon_platform.strict_json import IDENTIFIER_MAX
from wire.responses.request import (
    EFFORT_BUDGETS,
    INPUT_ROLES,
    METADATA_KEY_MAX,
    METADATA_MAX_PAIRS,
    METADATA_VALUE_MAX,
    TEMPERATURE_MAX,
)

RESPONSES_PATH = "/v1/responses"
RESPONSE_PATH = "/v1/responses/{response_id}"


def _texts() -> dict:
    """A message's content: a string or text parts (input_text, output_text, refusal)."""
    part = obj(
        {
            "type": {"enum": ["input_text", "output_text", "text", "refusal"]},
            "text": STRING,
            "refusal": STRING,
        },
        ("type",),
        description="Text. input_image, input_file and input_audio parts are refused "
        "(400 naming the part): no loaded model reads them.",
    )
    return {"anyOf": [STRING, {"type": "array", "items": part}]}


def schemas() -> dict:
    ident = {"type": "string", "maxLength": IDENTIFIER_MAX}
    message_item = obj(
        {
            "type": {"const": "message"},
            "role": {"enum": list(INPUT_ROLES), "description": "developer is read as system."},
            "content": _texts(),
        },
        ("role", "content"),
    )
    function_call_item = obj(
        {
            "type": {"const": "function_call"},
            "call_id": {**ident, "minLength": 1},
            "name": {**ident, "minLength": 1},
            "arguments": {"type": "string", "description": "The arguments as JSON text."},
        },
        ("type", "call_id", "name", "arguments"),
    )
    function_output_item = obj(
        {
            "type": {"const": "function_call_output"},
            "call_id": {**ident, "minLength": 1},
            "output": _texts(),
        },
        ("type", "call_id", "output"),
    )
    reasoning_item = obj(
        {
            "type": {"const": "reasoning"},
            "content": {
                "type": "array",
                "items": obj({"type": STRING, "text": STRING}, ("text",)),
            },
        },
        ("type",),
        description="Its text becomes the next assistant turn's reasoning.",
    )
    function_tool = obj(
        {
            "type": {"const": "function"},
            "name": {"type": "string", "minLength": 1},
            "description": nullable(STRING),
            "parameters": nullable({"type": "object"}),
            "strict": nullable(BOOL),
        },
        ("type", "name"),
        description="A function tool (Responses' flat shape). Other tool types are 400.",
    )
    text_format = {
        "anyOf": [
            obj({"type": {"enum": ["text", "json_object"]}}, ("type",)),
            obj(
                {
                    "type": {"const": "json_schema"},
                    "name": {"type": "string", "minLength": 1, "maxLength": 64},
                    "schema": {"type": "object"},
                    "strict": nullable(BOOL),
                    "description": nullable(STRING),
                },
                ("type", "name", "schema"),
            ),
        ]
    }
    request = obj(
        {
            "model": nullable(
                {**ident, "description": "Served name or alias; with one model any value."}
            ),
            "input": {
                "anyOf": [
                    STRING,
                    {
                        "type": "array",
                        "maxItems": settings.PANTHEON_MAX_MESSAGES,
                        "items": {
                            "anyOf": [
                                message_item,
                                function_call_item,
                                function_output_item,
                                reasoning_item,
                            ]
                        },
                    },
                ],
                "description": "Required unless previous_response_id is given.",
            },
            "instructions": nullable(
                {"type": "string", "description": "A system message; not carried over."}
            ),
            "tools": nullable(
                {"type": "array", "maxItems": settings.PANTHEON_MAX_TOOLS, "items": function_tool}
            ),
            "tool_choice": nullable(
                {
                    "anyOf": [
                        {"enum": ["auto", "none", "required"]},
                        obj({"type": {"const": "function"}, "name": STRING}, ("type", "name")),
                    ]
                }
            ),
            "text": nullable(
                obj(
                    {
                        "format": nullable(text_format),
                        "verbosity": nullable({"enum": ["low", "medium", "high"]}),
                    }
                )
            ),
            "reasoning": nullable(
                obj(
                    {
                        "effort": nullable(
                            {
                                "enum": list(EFFORT_BUDGETS),
                                "description": "none/minimal: no thinking; low 512, medium "
                                "2048, high 8192, xhigh 16384 reasoning tokens; max: no "
                                "budget (think-style templates only).",
                            }
                        ),
                        "summary": nullable({"enum": ["auto", "concise", "detailed"]}),
                    }
                )
            ),
            "temperature": nullable({"type": "number", "minimum": 0, "maximum": TEMPERATURE_MAX}),
            "top_p": nullable({"type": "number", "minimum": 0, "maximum": 1}),
            "max_output_tokens": nullable({**INT64, "minimum": 1, "description": "Default 1024."}),
            "top_logprobs": nullable({"type": "integer", "minimum": 0, "maximum": 20}),
            "seed": nullable(INT64),
            "store": nullable({"type": "boolean", "description": "Default true."}),
            "stream": nullable(BOOL),
            "parallel_tool_calls": nullable(BOOL),
            "previous_response_id": nullable(ident),
            "prompt_cache_key": nullable(
                {**ident, "description": "The session id (prefix cache) to run under."}
            ),
            "session_id": nullable(ident),
            "metadata": nullable(
                {
                    "type": "object",
                    "maxProperties": METADATA_MAX_PAIRS,
                    "propertyNames": {"maxLength": METADATA_KEY_MAX},
                    "additionalProperties": {"type": "string", "maxLength": METADATA_VALUE_MAX},
                }
            ),
            "background": nullable({"const": False}),
        },
        additionalProperties=True,
    )
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
            "previous_response_id": nullable(STRING),
            "instructions": nullable(STRING),
            "store": BOOL,
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
        "ResponseStreamEvent": obj(
            {"type": STRING, "sequence_number": NON_NEGATIVE, "response": ref("Response")},
            ("type", "sequence_number"),
        ),
    }


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
            "(store: true, the default) for GET and previous_response_id.",
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
            (400, 404, 413, 422, 429, 503),
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
            "A stored response, as created (404 for another key's, or one not stored)",
            ok(ref("Response")),
            (404,),
            tag="client",
        ),
        "delete": operation(
            RESPONSE_PATH,
            "deleteResponse",
            "Delete a stored response (404 for another key's, or one not stored)",
            ok(ref("ResponseDeleted")),
            (404,),
            tag="client",
        ),
    }
