"""Two architectures from one server: gemma3 (SentencePiece, K-quants) beside SmolLM2."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.daphne_server import running_server

pytestmark = pytest.mark.timeout(600)
SMOL, GEMMA = "smollm2-135m-instruct", "gemma3"


@pytest.fixture(scope="module")
def server(tmp_path_factory, smollm2_path, gemma3_path):
    models = {SMOL: smollm2_path, GEMMA: gemma3_path}
    with running_server(tmp_path_factory.mktemp("pantheon-data"), models) as srv:
        yield srv


def test_both_models_are_listed(server):
    ids = sorted(m["id"] for m in httpx.get(server.url + "/v1/models").json()["data"])
    assert ids == [GEMMA, SMOL]


@pytest.mark.parametrize("model", [SMOL, GEMMA])
def test_each_model_answers_by_name(server, model):
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "temperature": 0,
        "max_tokens": 12,
    }
    response = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=300)
    assert response.status_code == 200, response.text
    reply = response.json()
    assert reply["model"] == model
    assert reply["choices"][0]["message"]["content"].strip()
    assert reply["usage"]["completion_tokens"] > 0


def test_the_operator_rows_show_architecture_and_quantisation(server):
    rows = {r["id"]: r for r in httpx.get(server.url + "/admin/models").json()["data"]}
    assert (rows[SMOL]["architecture"], rows[SMOL]["quantization"]) == ("llama", "Q4_1")
    assert (rows[GEMMA]["architecture"], rows[GEMMA]["quantization"]) == ("gemma3", "Q4_K_M")
