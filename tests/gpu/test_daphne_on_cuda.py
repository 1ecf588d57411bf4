"""The real server on the GPU: `daphne pantheon_site.asgi:application` with
PANTHEON_BACKEND=cuda, a model loaded on die 0 serving chat, a stream and a session turn,
and the operator rows saying where it runs (kernel cuda, VRAM, dies, CUDA graphs live,
attention on the die). The model is a tiny llama GGUF written here (the shipped SmolLM2
does not travel to the GPU machine). Needs the server's packages there: `make
gpu-wheels` carries them (tests/gpu/run-on-device.sh). Run on an H200."""

from __future__ import annotations

import json
import os

import pytest

from tests.tiny_gguf import write_tiny_llama

pytestmark = pytest.mark.timeout(300)
HI = [{"role": "user", "content": "Hello there, how are you today?"}]


@pytest.fixture(scope="module")
def server(cp, tmp_path_factory):
    try:
        import daphne  # noqa: F401
        import django  # noqa: F401
    except ImportError as exc:
        why = f"the server's packages are not installed here ({exc}): make gpu-wheels"
        if os.environ.get("PANTHEON_REQUIRE_GPU") == "1":
            pytest.fail(why, pytrace=False)
        pytest.skip(why)
    from tests.e2e.daphne_server import running_server

    root = tmp_path_factory.mktemp("cuda-server")
    (root / "models").mkdir()
    (root / "data").mkdir()
    model = write_tiny_llama(root / "models" / "tiny.gguf", n_layer=4, context_length=512)
    env = {"PANTHEON_BACKEND": "cuda", "PANTHEON_CTX_CAP": "512"}
    with running_server(root / "data", {"tiny": model}, **env) as srv:
        yield srv


def test_health_says_cuda(server):
    import httpx

    body = httpx.get(server.url + "/").json()
    assert body["backend"] == "cuda" and body["accelerator"] is True
    assert body["dies_visible"] >= 1


def test_chat_stream_and_a_session_turn_on_the_device(server):
    import httpx

    with httpx.Client(base_url=server.url, timeout=120) as client:
        body = {"model": "tiny", "messages": HI, "max_tokens": 8, "temperature": 0}
        first = client.post("/v1/chat/completions", json={**body, "session_id": "gpu"}).json()
        assert first["usage"]["completion_tokens"] > 0, first
        turn_2 = [*HI, first["choices"][0]["message"], {"role": "user", "content": "And?"}]
        second = client.post(
            "/v1/chat/completions", json={**body, "messages": turn_2, "session_id": "gpu"}
        ).json()
        assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0, second

        chunks = []
        stream = {**body, "stream": True, "temperature": 0.7, "seed": 1}
        with client.stream("POST", "/v1/chat/completions", json=stream) as response:
            assert response.status_code == 200
            for line in response.iter_lines():
                if line.startswith("data: "):
                    chunks.append(line[6:])
        assert chunks[-1] == "[DONE]"
        assert any(json.loads(c)["choices"][0]["delta"].get("content") for c in chunks[1:-1])

        (row,) = client.get("/admin/models").json()["data"]
        assert row["kernel"] == "cuda" and row["dies"] == [0], row
        assert row["vram_bytes"] > 0 and row["host_bytes"] == 0
        assert row["attention"]["ondie"] == row["attention"]["total"] > 0
        graphs = row["graphs"]
        assert graphs["live"] >= 1 and graphs["failed"] == 0, graphs
        (die,) = [d for d in client.get("/admin/dies").json()["data"] if d["die"] == 0]
        assert die["model"] == "tiny" and die["vram_used"] >= row["vram_bytes"]
