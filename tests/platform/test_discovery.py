"""Models already on disk (PANTHEON_DISCOVER): a fake Ollama store, LM Studio folder and
Hugging Face hub cache, laid out as the real ones (manifests -> blobs; publisher/repo;
snapshots symlinked to blobs), written here around tiny real GGUFs. They are listed in
/v1/models, /api/tags and the console under their tools' names, a broken one as
unloadable with the reason, and a chat request naming one loads it and answers."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from django.test import AsyncClient

from pantheon_platform import discovery
from tests.model_stores import hf_model, ollama_model
from tests.tiny_gguf import write_tiny_llama


@pytest.fixture(scope="module")
def tiny_bytes(tmp_path_factory) -> bytes:
    path = write_tiny_llama(tmp_path_factory.mktemp("tiny") / "tiny.gguf")
    return path.read_bytes()


@pytest.fixture
def stores(tmp_path, tiny_bytes, settings):
    ollama, lmstudio, hub = tmp_path / "ollama", tmp_path / "lmstudio", tmp_path / "hub"
    ollama_model(ollama, "tiny", "1b", tiny_bytes)
    ollama_model(ollama, "broken", "latest", b"this is not a model at all")
    ollama_model(ollama, "tool", "v1", tiny_bytes, namespace="someone")
    (lmstudio / "pub" / "tiny-GGUF").mkdir(parents=True)
    (lmstudio / "pub" / "tiny-GGUF" / "tiny-F32.gguf").write_bytes(tiny_bytes)
    (lmstudio / "pub" / "tiny-GGUF" / "mmproj-tiny.gguf").write_bytes(tiny_bytes)
    hf_model(hub, "org", "tiny-GGUF", "tiny-Q8_0.gguf", tiny_bytes)
    outside = tmp_path / "elsewhere" / "escape.gguf"
    outside.parent.mkdir()
    outside.write_bytes(tiny_bytes)
    snapshot = hub / "models--org--escape" / "snapshots" / ("b" * 40)
    snapshot.mkdir(parents=True)
    (snapshot / "escape.gguf").symlink_to(outside)  # out of the store: never loadable
    settings.PANTHEON_DISCOVER = True
    settings.PANTHEON_DISCOVER_DIRS = {
        "ollama": [ollama],
        "lmstudio": [lmstudio],
        "huggingface": [hub],
    }
    return tmp_path


NAMES = [
    "broken:latest",
    "org/escape/escape",
    "org/tiny-GGUF/tiny-Q8_0",
    "pub/tiny-GGUF/tiny-F32",
    "someone/tool:v1",
    "tiny:1b",
]


def test_the_stores_are_listed_under_their_names(stores):
    found = {m.name: m for m in discovery.discovered()}
    assert sorted(found) == NAMES
    assert found["tiny:1b"].source == "ollama" and not found["tiny:1b"].error
    assert len(found["tiny:1b"].digest) == 64
    assert found["org/tiny-GGUF/tiny-Q8_0"].source == "huggingface"
    assert found["pub/tiny-GGUF/tiny-F32"].source == "lmstudio"
    assert "not a GGUF file" in found["broken:latest"].error
    assert "outside the model folders" in found["org/escape/escape"].error
    assert discovery.find("tiny:1b").name == "tiny:1b"
    assert discovery.find("broken").name == "broken:latest"  # Ollama's implied :latest


def test_off_lists_nothing_and_allows_no_store(stores, settings):
    from pantheon_platform.model_files import allowed_model_path

    settings.PANTHEON_DISCOVER = False
    assert discovery.discovered() == []
    with pytest.raises(PermissionError):
        allowed_model_path(str(stores / "ollama" / "blobs"))


def test_an_unreadable_manifest_is_listed_not_raised(stores):
    manifest = stores / "ollama" / "manifests" / "registry.ollama.ai" / "library" / "bad" / "x"
    manifest.parent.mkdir(parents=True)
    manifest.write_text("{not json")
    found = {m.name: m for m in discovery.discovered()}
    assert found["bad:x"].error.startswith("unreadable manifest")


@pytest.mark.anyio
@pytest.mark.django_db(transaction=True)
async def test_v1_models_and_api_tags_list_them(stores, empty_runtime):
    client = AsyncClient()
    rows = {r["id"]: r for r in (await client.get("/v1/models")).json()["data"]}
    assert sorted(rows) == NAMES
    assert rows["tiny:1b"]["owned_by"] == "ollama" and rows["tiny:1b"]["loadable"] is True
    assert rows["tiny:1b"]["loaded"] is False
    assert rows["broken:latest"]["loadable"] is False
    assert "not a GGUF file" in rows["broken:latest"]["error"]
    one = (await client.get("/v1/models/org/tiny-GGUF/tiny-Q8_0")).json()
    assert one["owned_by"] == "huggingface"
    tags = {r["name"]: r for r in (await client.get("/api/tags")).json()["models"]}
    assert "broken:latest" not in tags
    assert tags["tiny:1b"]["details"]["family"] == "llama"
    assert tags["tiny:1b"]["digest"] == discovery.find("tiny:1b").digest
    assert tags["pub/tiny-GGUF/tiny-F32:latest"]["size"] > 0


def test_the_console_lists_them(stores, empty_runtime):
    from operators import files

    rows = {r["name"]: r for r in files.available_models(empty_runtime) if "source" in r}
    assert rows["tiny:1b"]["architecture"] == "llama" and not rows["tiny:1b"]["loaded"]
    assert "error" in rows["broken:latest"]
    assert rows["org/tiny-GGUF/tiny-Q8_0"]["source"] == "huggingface"


async def chat(client: AsyncClient, model: str):
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 4,
        "temperature": 0,
    }
    return await client.post(
        "/v1/chat/completions", data=json.dumps(body), content_type="application/json"
    )


@pytest.mark.anyio
@pytest.mark.django_db(transaction=True)
async def test_chat_under_their_names_loads_them(stores, empty_runtime):
    client = AsyncClient()
    try:
        for name in ("tiny:1b", "org/tiny-GGUF/tiny-Q8_0"):
            response = await chat(client, name)
            assert response.status_code == 200, response.content
            assert response.json()["model"] == name
        assert sorted(empty_runtime.services()) == ["org/tiny-GGUF/tiny-Q8_0", "tiny:1b"]
        real = Path(empty_runtime.services()["tiny:1b"].path).resolve()
        assert real.is_relative_to((stores / "ollama" / "blobs").resolve())  # not copied
        rows = {r["id"]: r for r in (await client.get("/v1/models")).json()["data"]}
        assert "loaded" not in rows["tiny:1b"]  # a served model's row
        response = await client.post(
            "/api/chat",
            data=json.dumps(
                {
                    "model": "someone/tool:v1",
                    "messages": [{"role": "user", "content": "hi"}],
                    "stream": False,
                    "options": {"num_predict": 2},
                }
            ),
            content_type="application/json",
        )
        assert response.status_code == 200, response.content
        assert response.json()["model"] == "someone/tool:v1"
    finally:
        empty_runtime.close()


@pytest.mark.anyio
@pytest.mark.django_db(transaction=True)
async def test_a_broken_or_escaping_model_is_refused_with_the_reason(stores, empty_runtime):
    client = AsyncClient()
    broken = await chat(client, "broken:latest")
    assert broken.status_code == 404
    assert "not a GGUF file" in broken.json()["error"]["message"]
    escape = await chat(client, "org/escape/escape")
    assert escape.status_code == 404
    assert "outside the model folders" in escape.json()["error"]["message"]
    assert empty_runtime.services() == {}
    assert os.path.exists(stores / "elsewhere" / "escape.gguf")
