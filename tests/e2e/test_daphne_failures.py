"""Error cases that need more than one model, or a model that really fails, on a real server.

Two tiny GGUFs written by the test: `tiny` works, `broken` loads but every forward pass
fails (ffn_down has the wrong width) — a real engine failure, no mocks.
"""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.daphne_server import running_server
from tests.tiny_gguf import write_tiny_llama

pytestmark = pytest.mark.timeout(300)
HI = [{"role": "user", "content": "hi"}]


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    models_dir = tmp_path_factory.mktemp("models")
    models = {
        "tiny": write_tiny_llama(models_dir / "tiny.gguf"),
        "broken": write_tiny_llama(models_dir / "broken.gguf", broken_ffn_down=True),
    }
    with running_server(tmp_path_factory.mktemp("pantheon-data"), models) as srv:
        yield srv


def chat(server, body) -> httpx.Response:
    return httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60)


def test_with_several_models_an_unknown_name_is_404_model_not_found(server):
    for body in ({"model": "nope", "messages": HI}, {"messages": HI}):
        response = chat(server, body)
        assert response.status_code == 404
        error = response.json()["error"]
        assert error == {"message": error["message"], "type": "model_not_found", "code": None}


def test_each_model_is_listed_and_routed_by_name(server):
    ids = [m["id"] for m in httpx.get(server.url + "/v1/models").json()["data"]]
    assert ids == ["broken", "tiny"]
    response = chat(server, {"model": "tiny", "messages": HI, "max_tokens": 3})
    assert response.status_code == 200, response.text
    assert response.json()["model"] == "tiny"


@pytest.mark.parametrize("stream", [False, True])
def test_a_failing_generation_is_500_server_error_without_a_traceback(server, stream):
    response = chat(server, {"model": "broken", "messages": HI, "stream": stream})
    assert response.status_code == 500
    body = response.json()
    assert body["error"]["type"] == "server_error" and body["error"]["code"] is None
    assert "Traceback" not in response.text and 'File "' not in response.text
    # The failure is logged for the operator, and the server keeps serving.
    assert "Traceback" in server.log_tail()
    assert chat(server, {"model": "tiny", "messages": HI, "max_tokens": 2}).status_code == 200
