"""The real server keeps what operators did across a restart: a model loaded over HTTP
(pinned, with an alias) is served again after the server stops and starts on the same
data dir; one that was unloaded is not. Tiny GGUFs written by the test."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.daphne_server import Server, running_server
from tests.tiny_gguf import write_tiny_llama

pytestmark = pytest.mark.timeout(300)
HI = [{"role": "user", "content": "hi"}]


def post(srv: Server, path: str, body: dict) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, timeout=60)


def served(srv: Server) -> list[str]:
    return [m["id"] for m in httpx.get(srv.url + "/v1/models").json()["data"]]


def answers(srv: Server, model: str) -> str:
    response = post(srv, "/v1/chat/completions", {"model": model, "messages": HI, "max_tokens": 2})
    assert response.status_code == 200, response.text
    return response.json()["model"]


def test_a_restart_serves_exactly_what_was_loaded(tmp_path_factory):
    models = tmp_path_factory.mktemp("models")
    for i, name in enumerate(["tiny", "other", "third"]):
        write_tiny_llama(models / f"{name}.gguf", seed=i)
    data = tmp_path_factory.mktemp("pantheon-data")
    seed = {"tiny": models / "tiny.gguf"}  # PANTHEON_MODELS: seeds the empty database

    with running_server(data, seed) as srv:
        load = {"path": "other.gguf", "name": "second", "ctx_cap": 64, "pinned": True}
        assert post(srv, "/admin/models/load", load).status_code == 200
        assert (
            post(srv, "/admin/aliases", {"alias": "gpt-4o", "target": "second"}).status_code == 200
        )
        assert post(srv, "/admin/models/load", {"path": "third.gguf"}).status_code == 200
        assert post(srv, "/admin/models/unload", {"name": "third"}).json() == {
            "unloaded": "third",
            "drained": True,
        }
        refused = post(srv, "/admin/models/load", {"path": "/etc/passwd"})
        assert refused.status_code == 403 and refused.json()["error"]["type"] == "load_failed"
        assert served(srv) == ["second", "tiny"]
        assert answers(srv, "gpt-4o") == "second"

    with running_server(data, seed, wait_for=["tiny", "second"]) as srv:
        assert served(srv) == ["second", "tiny"]
        assert answers(srv, "tiny") == "tiny" and answers(srv, "second") == "second"
        assert answers(srv, "gpt-4o") == "second"
        rows = {r["id"]: r for r in httpx.get(srv.url + "/admin/models").json()["data"]}
        assert rows["second"]["pinned"] is True and rows["second"]["context_window"] == 64
        assert rows["second"]["aliases"] == ["gpt-4o"]
        assert "third" not in httpx.get(srv.url + "/").json()["models"]
        assert "Traceback" not in srv.log_tail()
