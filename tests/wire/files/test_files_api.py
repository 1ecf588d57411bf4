"""The Files API through the unmodified OpenAI SDK in-process: upload (multipart, streamed
to disk, hashed), list, retrieve, content, delete; another key sees none of it (404);
the size limit and the per-key quota are 4xx."""

from __future__ import annotations

import hashlib

import openai
import pytest

from tests.access.helpers import bearer, in_db
from tests.access.helpers import call as raw_call
from tests.wire.files.sdk_helpers import new_key, sdk

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.anyio]

CONTENT = b'{"custom_id": "a", "method": "POST", "url": "/v1/embeddings", "body": {}}\n'


async def test_upload_list_retrieve_read_and_delete_a_file(app, files_dir):
    client = sdk(app, await new_key("a"))
    made = await client.files.create(file=("input.jsonl", CONTENT), purpose="batch")
    assert made.id.startswith("file-") and made.object == "file"
    assert (made.bytes, made.filename, made.purpose) == (len(CONTENT), "input.jsonl", "batch")
    assert (files_dir / made.id).read_bytes() == CONTENT
    from wire.files.models import StoredFile

    row = await in_db(StoredFile.objects.get, id=made.id)
    assert row.sha256 == hashlib.sha256(CONTENT).hexdigest()
    assert (await client.files.retrieve(made.id)).bytes == len(CONTENT)
    assert [f.id for f in (await client.files.list()).data] == [made.id]
    assert (await client.files.content(made.id)).content == CONTENT
    deleted = await client.files.delete(made.id)
    assert deleted.deleted and deleted.id == made.id
    assert not (files_dir / made.id).exists()
    with pytest.raises(openai.NotFoundError):
        await client.files.retrieve(made.id)


async def test_another_key_can_neither_see_read_nor_delete_a_file(app, files_dir):
    owner, other = sdk(app, await new_key("a")), sdk(app, await new_key("b"))
    made = await owner.files.create(file=("input.jsonl", CONTENT), purpose="batch")
    with pytest.raises(openai.NotFoundError):
        await other.files.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        await other.files.content(made.id)
    with pytest.raises(openai.NotFoundError):
        await other.files.delete(made.id)
    assert (await other.files.list()).data == []
    assert (await owner.files.retrieve(made.id)).id == made.id


async def test_a_bad_purpose_an_oversized_file_and_the_quota_are_refused(app, files_dir, settings):
    client = sdk(app, await new_key("a"))
    with pytest.raises(openai.BadRequestError, match="purpose"):
        await client.files.create(file=("x.jsonl", CONTENT), purpose="fine-tune")
    settings.PANTHEON_FILES_MAX_BYTES = 10
    with pytest.raises(openai.APIStatusError) as too_big:
        await client.files.create(file=("x.jsonl", CONTENT), purpose="batch")
    assert too_big.value.status_code == 413
    settings.PANTHEON_FILES_MAX_BYTES = 2**20
    settings.PANTHEON_FILES_QUOTA_BYTES = len(CONTENT) + 10
    await client.files.create(file=("x.jsonl", CONTENT), purpose="batch")
    with pytest.raises(openai.BadRequestError, match="quota"):
        await client.files.create(file=("y.jsonl", CONTENT), purpose="batch")


async def test_a_json_body_is_not_an_upload(app, files_dir):
    key = await new_key("a")
    reply = await raw_call(app, "POST", "/v1/files", body={"purpose": "batch"}, headers=bearer(key))
    reply.error(400, "invalid_request_error")


async def test_a_broken_multipart_form_is_a_400(app, files_dir):
    key = await new_key("a")
    headers = {**bearer(key), "content-type": "multipart/form-data; boundary=zz"}
    reply = await raw_call(app, "POST", "/v1/files", body=b"--zz\r\nnot a part", headers=headers)
    reply.error(400, "invalid_request_error")
