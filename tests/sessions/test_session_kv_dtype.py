"""Session blobs record the KV cache's type (the `kv_dtype` load option): an f16 instance
exports f16 rows, restores them into an f16 instance, and a blob of one type restored
into an instance of another is a 400 bad_session_blob that names both types."""

from __future__ import annotations

import base64
import dataclasses
import json

import pytest

from engine.serving import session_blob_read
from tests.conftest import SMOLLM2_NAME
from tests.wire.helpers import CHAT

pytestmark = pytest.mark.anyio

EXPORT = "/admin/session/export"
RESTORE = "/session/restore"
TURN = [{"role": "user", "content": "My name is Ann. Say hi."}]


async def post(client, path: str, body):
    return await client.post(path, data=json.dumps(body), content_type="application/json")


@pytest.fixture
def sibling(served, smollm2_service):
    """More instances over SmolLM2's weights (kv_dtype as asked), closed afterwards."""
    made = []

    def make(name: str, **config):
        svc = smollm2_service.sibling(
            dataclasses.replace(smollm2_service.config, name=name, ctx_cap=256, **config)
        )
        made.append(svc)
        served.register(name, svc)
        return svc

    yield make
    for svc in made:
        svc.close()


async def exported(client, model: str, session_id: str) -> dict:
    body = {"model": model, "messages": TURN, "temperature": 0, "max_tokens": 3}
    answer = await post(client, CHAT, {**body, "session_id": session_id})
    assert answer.status_code == 200, answer.content
    response = await post(client, EXPORT, {"name": model, "session_id": session_id})
    assert response.status_code == 200, response.content
    return response.json()


async def test_a_blob_records_the_kv_type_and_restores_only_into_the_same(client, sibling):
    f16 = sibling("kv-f16", kv_dtype="f16")
    sibling("kv-f16-b", kv_dtype="f16")
    sibling("kv-q8", kv_dtype="q8_0")
    assert f16.kv.kv_dtype == "f16"
    blob16 = await exported(client, "kv-f16", "s16")
    header = session_blob_read.read_header(base64.b64decode(blob16["blob_b64"]))
    assert header["kv_dtype"] == "float16"
    assert blob16["blob_bytes"] < 2 * header["n_tok"] * 30 * 3 * 64 * 2 + 4096  # f16 rows

    restore = {"blob": blob16["blob_b64"], "tokens": blob16["tokens"], "session_id": "s16"}
    ok = await post(client, RESTORE, {**restore, "name": "kv-f16-b"})
    assert ok.status_code == 200, ok.content
    for name, theirs in ((SMOLLM2_NAME, "f32"), ("kv-q8", "q8_0")):
        refused = await post(client, RESTORE, {**restore, "name": name})
        assert refused.status_code == 400, refused.content
        error = refused.json()["error"]
        assert error["type"] == "bad_session_blob"
        assert "KV cache type is f16" in error["message"] and theirs in error["message"]

    blob32 = await exported(client, SMOLLM2_NAME, "s32")
    header = session_blob_read.read_header(base64.b64decode(blob32["blob_b64"]))
    assert header["kv_dtype"] == "float32"  # the default's blobs are as before
    restore = {"blob": blob32["blob_b64"], "tokens": blob32["tokens"], "session_id": "s32"}
    refused = await post(client, RESTORE, {**restore, "name": "kv-q8"})
    assert refused.status_code == 400 and "type is f32" in refused.json()["error"]["message"]
