"""What the router reads of a request to place it (cluster/dispatch.py): its model,
session and stored response (`Target`), from a body parsed only as far as routing needs
(a large one off the event loop, a restore's blob skipped)."""

from __future__ import annotations

import asyncio
import io
import json
from urllib.parse import parse_qs

from access import forwarded
from pantheon_platform import tenancy
from pantheon_platform.json_blob import BodyTooLarge, split_field

SESSION_FIELDS = ("session_id", "prompt_cache_key", "promptCacheKey")  # the contract's order
PARSE_OFF_LOOP_BYTES = 256 * 1024


class Target:
    """What a request is routed by: its model, session and stored response."""

    def __init__(self, scope, body: dict):
        self.path = scope["path"]
        # The caller's namespace as the instances know it (and as affinity is keyed):
        # unique to this cluster's secret, never an instance-local key's.
        self.namespace = forwarded.cluster_namespace(tenancy.namespace(scope))
        query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
        model = body.get("model") if isinstance(body.get("model"), str) else body.get("name")
        if not isinstance(model, str) or not model:
            model = (query.get("name") or [""])[0]
        self.model = model or None
        self.session_id = _first_string(
            [body.get(f) for f in SESSION_FIELDS]
            + [_header(scope, b"x-session-id"), (query.get("session_id") or [None])[0]]
        )
        response_id = None
        if self.path.startswith("/v1/responses/"):  # .../{id} and .../{id}/input_items
            response_id = self.path.removeprefix("/v1/responses/").split("/")[0]
        elif isinstance(body.get("previous_response_id"), str):
            response_id = body["previous_response_id"]
        self.response_id = response_id
        self.makes_response = self.path == "/v1/responses" and scope["method"] == "POST"
        # The session's recorded instance is gone (dead, dropped, drained): it re-prefills
        # wherever it lands now.
        self.rehomed = False
        self.session_dropped = False  # served without its session id (see forward)


async def without_session(body: bytes) -> bytes:
    """The request body without its session fields (the JSON routes; the header is
    dropped by _headers)."""
    data = await json_object(body)
    if not any(field in data for field in SESSION_FIELDS):
        return body
    for field in SESSION_FIELDS:
        data.pop(field, None)
    return json.dumps(data, ensure_ascii=False).encode()


async def json_object(body: bytes, skip_blob: bool = False) -> dict:
    """The body as a JSON object for routing, {} when it is not one (the instance answers
    the 400 in its wire format). A restore's blob (most of its body) is skipped, not
    parsed: routing needs only its session id and model."""
    if not body.strip():
        return {}
    parse = _without_blob if skip_blob else json.loads
    try:
        if len(body) > PARSE_OFF_LOOP_BYTES:
            data = await asyncio.to_thread(parse, body)
        else:
            data = parse(body)
    except (ValueError, RecursionError):
        return {}
    return data if isinstance(data, dict) else {}


def _without_blob(body: bytes):
    try:
        rest = split_field(io.BytesIO(body).read, b"blob", len(body), _ignore, _ignore)
    except BodyTooLarge:  # more than 16 MiB besides the blob: the instance refuses it
        return {}
    return json.loads(rest)


def _ignore(*_) -> None:
    pass


def _first_string(values: list) -> str | None:
    return next((v for v in values if isinstance(v, str) and v), None)


def _header(scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", ()):
        if key.lower() == name:
            return value.decode("latin-1")
    return None
