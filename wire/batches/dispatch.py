"""One batch line run as the request it stands for: through Django's own ASGI handler
(the endpoint's view, its validation and rendering, exactly as over HTTP), in the batch
key's namespace and the `batch` priority class (pantheon_platform.tenancy), never
streamed. The answer becomes OpenAI's output line {"id", "custom_id", "response":
{"status_code", "request_id", "body"}, "error"}."""

from __future__ import annotations

import asyncio
import json
import secrets

from pantheon_platform import tenancy

STREAM_REFUSED = {
    "error": {
        "message": "stream: a batch line cannot stream; leave stream out or false",
        "type": "invalid_request_error",
        "param": "stream",
        "code": None,
    }
}


def scope_for(endpoint: str, namespace: str, body: bytes) -> dict:
    return {
        "type": "http",
        "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": endpoint,
        "raw_path": endpoint.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [
            (b"host", b"localhost"),
            (b"content-type", b"application/json"),
            (b"content-length", str(len(body)).encode()),
        ],
        "client": ("127.0.0.1", 0),
        "server": ("127.0.0.1", 80),
        tenancy.SCOPE_NAMESPACE: namespace,
        tenancy.SCOPE_OPERATOR: False,
        tenancy.SCOPE_PRIORITY: tenancy.BATCH,
    }


async def run_line(app, endpoint: str, namespace: str, custom_id: str, body: dict):
    """(ok: a 2xx, the output line)."""
    if body.get("stream"):
        return False, _line(custom_id, 400, STREAM_REFUSED)
    raw = json.dumps(body).encode()
    sent = False
    status, chunks = 500, []

    async def receive():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": raw, "more_body": False}
        # No disconnect ever (Django would cancel the view): Django cancels this wait
        # itself once the response is sent.
        await asyncio.Future()

    async def send(message):
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message["type"] == "http.response.body":
            chunks.append(message.get("body", b""))

    await app(scope_for(endpoint, namespace, raw), receive, send)
    try:
        answer = json.loads(b"".join(chunks) or b"null")
    except ValueError:
        answer = {"error": {"message": "the endpoint answered no JSON", "type": "server_error"}}
    return 200 <= status < 300, _line(custom_id, status, answer)


def _line(custom_id: str, status: int, body) -> dict:
    request_id = body.get("id") if isinstance(body, dict) and status < 300 else None
    return {
        "id": f"batch_req_{secrets.token_hex(12)}",
        "custom_id": custom_id,
        "response": {
            "status_code": status,
            "request_id": request_id or f"req_{secrets.token_hex(12)}",
            "body": body,
        },
        "error": None,
    }
