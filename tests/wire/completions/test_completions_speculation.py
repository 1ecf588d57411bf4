"""The `speculation` extension on POST /v1/completions: "auto" or "off" (anything else is
a 400 naming it), and the same tokens (and logprobs) either way."""

from __future__ import annotations

import json

import pytest
from django.test import Client

# A prompt the model goes on copying: the context drafts its continuation.
LOOPING = "The cat sat on the mat. The cat sat on the mat. The cat sat on the mat. The cat"


@pytest.fixture
def http() -> Client:
    return Client(enforce_csrf_checks=True)


def post(http: Client, body: dict):
    return http.post("/v1/completions", data=json.dumps(body), content_type="application/json")


@pytest.mark.parametrize("value", ["fast", "", "Off", True, 0, ["auto"]])
def test_a_bad_speculation_is_a_400_naming_it(http, empty_runtime, value):
    response = post(http, {"prompt": "Hi", "speculation": value})
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["param"] == "speculation"
    assert error["message"].startswith('speculation: expected "auto" or "off"')


def test_the_tokens_are_the_same_with_speculation_on_or_off(http, served):
    body = {"prompt": LOOPING, "max_tokens": 16, "temperature": 0, "logprobs": 2}
    answers = {}
    for mode in (None, "auto", "off"):
        response = post(http, {**body, "speculation": mode})
        assert response.status_code == 200, response.content
        answers[mode] = response.json()
    texts = {mode: a["choices"][0]["text"] for mode, a in answers.items()}
    assert texts["auto"] == texts["off"] == texts[None] and texts["off"]
    logprobs = {mode: a["choices"][0]["logprobs"] for mode, a in answers.items()}
    assert logprobs["auto"] == logprobs["off"] == logprobs[None]
    assert {json.dumps(a["usage"]) for a in answers.values()} == {
        json.dumps(answers[None]["usage"])
    }
