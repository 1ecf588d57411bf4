"""/v1/completions, /v1/embeddings, /tokenize and /detokenize in-process (Django's client,
the real SmolLM2): what each refuses is a 400 in the OpenAI error shape naming the field,
never a 500; the answers' shapes. The SDK acceptance over Daphne is
tests/e2e/test_sdk_completions.py."""

from __future__ import annotations

import base64
import json

import numpy as np
import pytest
from django.test import Client

from tests.conftest import SMOLLM2_NAME

MODEL = SMOLLM2_NAME


@pytest.fixture
def http() -> Client:
    return Client(enforce_csrf_checks=True)


def post(http: Client, path: str, body) -> object:
    data = body if isinstance(body, bytes) else json.dumps(body)
    return http.post(path, data=data, content_type="application/json")


def refused(response, status: int, param: str | None = None) -> dict:
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == {"error"} and set(body["error"]) >= {"message", "type", "code"}, body
    if param is not None:
        assert body["error"].get("param") == param, body
    return body["error"]


@pytest.mark.parametrize(
    "body, param",
    [
        ({"prompt": "Hi", "suffix": "end"}, "suffix"),
        ({"prompt": "Hi", "best_of": 2}, "best_of"),
        ({"prompt": "Hi", "n": 2, "best_of": 3}, "best_of"),
        ({}, "prompt"),
        ({"prompt": []}, "prompt"),
        ({"prompt": ["a", 1]}, "prompt"),
        ({"prompt": [[1, 2], []]}, "prompt"),
        ({"prompt": [-1]}, "prompt"),
        ({"prompt": [True]}, "prompt"),
        ({"prompt": {"text": "x"}}, "prompt"),
        ({"prompt": [10**9]}, "prompt"),  # outside the vocabulary (the core says so)
        ({"prompt": ["x"] * 65}, "prompt"),
        ({"prompt": "Hi", "logprobs": 21}, "logprobs"),
        ({"prompt": "Hi", "logprobs": True}, "logprobs"),
        ({"prompt": "Hi", "max_tokens": -1}, "max_tokens"),
        ({"prompt": "Hi", "n": 9}, "n"),
        ({"prompt": "Hi", "echo": "yes"}, "echo"),
    ],
)
def test_completions_refuses_bad_requests_naming_the_field(http, served, body, param):
    refused(post(http, "/v1/completions", body), 400, param)


@pytest.mark.parametrize(
    "body, param",
    [
        ({"input": "Hi", "dimensions": 64}, "dimensions"),
        ({"input": ""}, "input"),
        ({"input": []}, "input"),
        ({"input": [[]]}, "input"),
        ({"input": [1.5]}, "input"),
        ({"input": [10**9]}, "input"),
        ({"input": "Hi", "encoding_format": "int8"}, "encoding_format"),
        ({}, "input"),
    ],
)
def test_embeddings_refuses_bad_requests_naming_the_field(http, served, body, param):
    refused(post(http, "/v1/embeddings", body), 400, param)


@pytest.mark.parametrize(
    "path, body, param",
    [
        ("/tokenize", {}, "content"),
        ("/tokenize", {"content": 5}, "content"),
        ("/tokenize", {"content": "x", "add_special": "no"}, "add_special"),
        ("/tokenize", {"content": "x", "parse_special": False}, "parse_special"),
        ("/detokenize", {"tokens": "1 2"}, "tokens"),
        ("/detokenize", {"tokens": [1, -2]}, "tokens"),
        ("/detokenize", {"tokens": [10**9]}, "tokens"),
    ],
)
def test_tokenize_routes_refuse_bad_requests(http, served, path, body, param):
    refused(post(http, path, body), 400, param)


def test_any_model_name_reaches_the_only_model_and_get_is_405(http, served):
    """As on the chat route: with one model loaded, any `model` routes to it."""
    for path in ("/v1/completions", "/v1/embeddings", "/tokenize", "/detokenize"):
        body = {"model": "gpt-x", "prompt": "x", "max_tokens": 1, "input": "x", "content": "x"}
        response = post(http, path, {**body, "tokens": [1]})
        assert response.status_code == 200, response.content
        assert response.json().get("model", MODEL) == MODEL
        error = refused(http.get(path), 405)
        assert error["type"] == "method_not_allowed"


def test_a_prompt_over_the_window_is_400_context_length_exceeded(http, served):
    window = served.resolve(None)[1].context_window_configured
    response = post(http, "/v1/completions", {"prompt": [1] * (window + 1)})
    error = refused(response, 400)
    assert (error["type"], error["code"]) == ("context_over_budget", "context_length_exceeded")
    assert (error["context_window"], error["prompt_tokens"]) == (window, window + 1)
    response = post(http, "/v1/embeddings", {"input": [1] * (window + 1)})
    error = refused(response, 400)
    assert (error["type"], error["code"]) == ("context_over_budget", "context_length_exceeded")


def test_a_completion_of_several_prompts(http, served):
    body = {"prompt": ["One, two,", "Red, green,"], "n": 2, "max_tokens": 3, "temperature": 0}
    response = post(http, "/v1/completions", body)
    assert response.status_code == 200, response.content
    answer = response.json()
    assert answer["object"] == "text_completion" and answer["model"] == MODEL
    assert [c["index"] for c in answer["choices"]] == [0, 1, 2, 3]
    # Greedy: both choices of a prompt agree; the prompts differ.
    texts = [c["text"] for c in answer["choices"]]
    assert texts[0] == texts[1] and texts[2] == texts[3]
    usage = answer["usage"]
    assert usage["completion_tokens"] == 12
    assert usage["total_tokens"] == usage["prompt_tokens"] + 12


def test_max_tokens_zero_with_echo_and_logprobs_scores_the_prompt(http, served):
    body = {"prompt": "The capital of France is Paris", "max_tokens": 0, "echo": True}
    answer = post(http, "/v1/completions", {**body, "logprobs": 2}).json()
    (choice,) = answer["choices"]
    assert choice["text"] == body["prompt"] and choice["finish_reason"] == "length"
    lp = choice["logprobs"]
    assert "".join(lp["tokens"]) == body["prompt"]
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
    assert all(x < 0 for x in lp["token_logprobs"][1:])
    assert all(len(top) <= 2 for top in lp["top_logprobs"][1:])
    assert lp["text_offset"][0] == 0 and lp["text_offset"][-1] == body["prompt"].rindex(" Paris")
    assert answer["usage"]["completion_tokens"] == 0


def test_embeddings_float_and_base64_agree(http, served):
    body = {"input": ["Hello world", "Bonjour le monde"]}
    floats = post(http, "/v1/embeddings", body).json()
    b64 = post(http, "/v1/embeddings", {**body, "encoding_format": "base64"}).json()
    assert [d["index"] for d in floats["data"]] == [0, 1]
    for f, b in zip(floats["data"], b64["data"], strict=True):
        decoded = np.frombuffer(base64.b64decode(b["embedding"]), dtype="<f4")
        assert decoded.tolist() == f["embedding"]
        assert abs(np.linalg.norm(decoded) - 1) < 1e-5
    assert floats["usage"]["prompt_tokens"] == floats["usage"]["total_tokens"] > 0


def test_tokenize_and_detokenize_round_trip(http, served):
    text = "Héllo, wörld! 👋"
    tokens = post(http, "/tokenize", {"content": text}).json()["tokens"]
    assert all(isinstance(t, int) for t in tokens)
    assert post(http, "/detokenize", {"tokens": tokens}).json() == {"content": text}
    pieces = post(http, "/tokenize", {"content": text, "with_pieces": True}).json()["tokens"]
    assert [p["id"] for p in pieces] == tokens
    joined = b"".join(
        bytes(p["piece"]) if isinstance(p["piece"], list) else p["piece"].encode() for p in pieces
    )
    assert joined.decode() == text
