"""A restore's memory is a small multiple of its blob (the body's base64 is decoded as it
streams: pantheon_platform/json_blob.py), measured with tracemalloc on the real SmolLM2."""

from __future__ import annotations

import json
import tracemalloc

import pytest

from tests.sessions.test_session_routes import RESTORE, export, post, turn

pytestmark = pytest.mark.anyio

LONG_TURN = [{"role": "user", "content": "Repeat after me. " + "The quick brown fox. " * 40}]


async def test_a_restore_holds_about_one_blob_in_memory(client, served):
    await turn(client, LONG_TURN, "mem-source", max_tokens=1)
    exported = await export(client, "mem-source")
    body = json.dumps(
        {"session_id": "mem-target", "blob": exported["blob_b64"], "tokens": exported["tokens"]}
    )
    body = body.encode()
    blob_bytes = len(exported["blob_b64"]) * 3 // 4
    assert blob_bytes > 8_000_000
    tracemalloc.start()
    try:
        response = await post(client, RESTORE, body)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert response.status_code == 200, response.content
    # The test client copies the body into its payload stream while traced (a server
    # spools it to disk): that copy is not the view's. The view holds the decoded blob
    # (a growing bytearray) and what restoring it takes; parsed whole it was ~5x.
    assert peak - len(body) < 2 * blob_bytes, (peak, len(body), blob_bytes)
