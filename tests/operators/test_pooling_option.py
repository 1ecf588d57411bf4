"""The `pooling` load option (how /v1/embeddings pools a text's hidden states): on the
load route, the operator row, the database store, and the embeddings it gives. Tiny
real GGUFs."""

from __future__ import annotations

import numpy as np

from tests.operators.helpers import error_of

LOAD = "/admin/models/load"


def embedding(api, model: str, text: str) -> np.ndarray:
    response = api.post("/v1/embeddings", {"model": model, "input": text})
    assert response.status_code == 200, response.content
    return np.asarray(response.json()["data"][0]["embedding"])


def test_pooling_is_a_load_option_with_a_default(api, rt, model_dir):
    default = api.post(LOAD, {"path": "tiny.gguf", "name": "default"})
    assert default.status_code == 200, default.content
    assert default.json()["pooling"] == "mean"  # the llama default
    last = api.post(LOAD, {"path": "tiny.gguf", "name": "last", "pooling": "last"})
    assert last.status_code == 200, last.content
    assert last.json()["pooling"] == "last"
    assert rt.services()["last"].config.pooling == "last"
    text = "a few words to embed"
    assert not np.array_equal(embedding(api, "default", text), embedding(api, "last", text))


def test_an_unknown_pooling_is_a_400(api, rt, model_dir):
    response = api.post(LOAD, {"path": "tiny.gguf", "pooling": "max"})
    assert "pooling" in error_of(response, 400, "invalid_request_error")


def test_the_store_keeps_the_pooling_for_the_next_start(api, db_rt, model_dir):
    from operators.models import ServedModel
    from operators.store import spec_of

    response = api.post(LOAD, {"path": "tiny.gguf", "name": "cls", "pooling": "cls"})
    assert response.status_code == 200, response.content
    assert spec_of(ServedModel.objects.get(name="cls")).config.pooling == "cls"
