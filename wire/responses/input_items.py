"""GET /v1/responses/{id}/input_items: the input a stored response answered, as OpenAI's
list of items (`client.responses.input_items.list`).

The items are the stored conversation before the response's output: a continued
response's earlier turns (inputs and outputs) included, `instructions` not (they are not
carried over, as OpenAI's are not). Each chat message of it becomes the item it came
from: a message (input_text parts; an assistant's output_text), a function_call per call
and a function_call_output per tool turn. Item ids are made from the response id and
the item's position, so `after` pages through them the same way every time.
"""

from __future__ import annotations

import logging

from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from pantheon_platform import tenancy
from pantheon_platform.errors import api_error_from, invalid_request, json_response
from pantheon_platform.errors import method_not_allowed as not_allowed
from wire.responses.views import stored_response

log = logging.getLogger("pantheon.http")

DEFAULT_LIMIT = 20
MAX_LIMIT = 100
ORDERS = ("asc", "desc")


def items_of(response_id: str, conversation: list[dict]) -> list[dict]:
    """The input items of the response whose stored conversation is `conversation` (its
    last message, the response's own output, left out), oldest first."""
    suffix = response_id.removeprefix("resp_")
    items: list[dict] = []

    def add(kind: str, prefix: str, **fields) -> None:
        items.append({"id": f"{prefix}_{suffix}{len(items):04x}", "type": kind, **fields})

    for message in conversation[:-1]:
        role, content = message.get("role"), message.get("content") or ""
        text = content if isinstance(content, str) else ""
        if role == "tool":
            add(
                "function_call_output",
                "fco",
                call_id=message.get("tool_call_id", ""),
                output=text,
                status="completed",
            )
            continue
        if role == "assistant":
            if text or not message.get("tool_calls"):
                part = {"type": "output_text", "text": text, "annotations": []}
                add("message", "msg", role="assistant", status="completed", content=[part])
            for call in message.get("tool_calls") or ():
                function = call.get("function") or {}
                add(
                    "function_call",
                    "fc",
                    call_id=call.get("id", ""),
                    name=function.get("name", ""),
                    arguments=function.get("arguments", "{}"),
                    status="completed",
                )
            continue
        part = {"type": "input_text", "text": text}
        add("message", "msg", role=role, status="completed", content=[part])
    return items


def page(items: list[dict], query) -> dict:
    """OpenAI's list page of `items` for the query's `order` (desc, the newest first, by
    default), `after` (an item id: those after it in that order) and `limit` (1..100)."""
    order = query.get("order", "desc")
    if order not in ORDERS:
        raise invalid_request("order: expected 'asc' or 'desc'", param="order")
    raw_limit = query.get("limit", str(DEFAULT_LIMIT))
    try:
        limit = int(raw_limit)
    except ValueError:
        limit = 0
    if not 1 <= limit <= MAX_LIMIT:
        raise invalid_request(f"limit: expected an integer from 1 to {MAX_LIMIT}", param="limit")
    ordered = items if order == "asc" else items[::-1]
    after = query.get("after")
    if after is not None:
        ids = [item["id"] for item in ordered]
        if after not in ids:
            raise invalid_request(f"after: no input item {after!r} in this response", "after")
        ordered = ordered[ids.index(after) + 1 :]
    data = ordered[:limit]
    return {
        "object": "list",
        "data": data,
        "first_id": data[0]["id"] if data else None,
        "last_id": data[-1]["id"] if data else None,
        "has_more": len(ordered) > limit,
    }


@csrf_exempt
async def input_items(request: HttpRequest, response_id: str) -> HttpResponse:
    """GET: the stored response's input items, a page at a time (404 as GET
    /v1/responses/{id} answers for an id the caller's key does not hold)."""
    if request.method != "GET":
        return not_allowed(request.method or "", ["GET", "OPTIONS"]).response()
    try:
        stored = await stored_response(tenancy.namespace(request), response_id)
        return json_response(page(items_of(response_id, stored.conversation), request.GET))
    except Exception as exc:
        error = api_error_from(exc)
        if error.status == 500:
            log.error("responses/%s/input_items failed", response_id, exc_info=exc)
        return error.response()
