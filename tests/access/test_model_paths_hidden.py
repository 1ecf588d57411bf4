"""A model's absolute file path is the server's own business (issue 36 item 9): Ollama's
`/api/show` names the GGUF's file name only to an inference key, the full path only to an
admin-scoped key (or on a server with no key); no client route lists the path."""

from __future__ import annotations

import pytest

from tests.access.helpers import ADMIN_KEY, CLIENT_KEY, bearer, call

pytestmark = [pytest.mark.anyio, pytest.mark.django_db(transaction=True)]


async def test_api_show_names_the_file_only_to_an_inference_key(app, tiny, env_keys, model_dir):
    shown = await call(app, "POST", "/api/show", body={"model": "tiny"}, headers=bearer(CLIENT_KEY))
    assert shown.status == 200
    modelfile = shown.json()["modelfile"]
    assert "FROM tiny.gguf\n" in modelfile
    assert str(model_dir) not in shown.body.decode()

    admin = await call(app, "POST", "/api/show", body={"model": "tiny"}, headers=bearer(ADMIN_KEY))
    assert f"FROM {model_dir / 'tiny.gguf'}\n" in admin.json()["modelfile"]


async def test_a_forwarded_client_is_not_an_operator(app, tiny, env_keys, model_dir):
    headers = {**bearer(ADMIN_KEY), "x-pantheon-namespace": "key:7"}  # a router's caller
    shown = await call(app, "POST", "/api/show", body={"model": "tiny"}, headers=headers)
    assert "FROM tiny.gguf\n" in shown.json()["modelfile"]


@pytest.mark.parametrize(
    "method, path",
    [("GET", "/api/tags"), ("GET", "/api/ps"), ("GET", "/v1/models"), ("GET", "/v1/models/tiny")],
)
async def test_no_client_listing_reveals_the_path(app, tiny, env_keys, model_dir, method, path):
    listed = await call(app, method, path, headers=bearer(CLIENT_KEY))
    assert listed.status == 200, listed.body.decode()
    assert str(model_dir) not in listed.body.decode() and "tiny.gguf" not in listed.body.decode()
