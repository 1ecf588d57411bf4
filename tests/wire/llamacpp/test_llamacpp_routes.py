"""llama-server's routes on the real SmolLM2 (in process, plain HTTP): GET /props and
GET /slots in the shapes llama.cpp's server README documents, POST /completion (greedy:
the same text as /v1/completions; streamed: the same text in `data:` chunks ending with
the final object), and POST /infill: its FIM prompt's layout, and llama-server's
not_supported_error (a 400 here, not its 501) for a model without FIM tokens (issue 35
item 6)."""

from __future__ import annotations

import json

import pytest
from django.test import Client

from wire.llamacpp.request import parse_infill

MODEL = "smollm2-135m-instruct"
PROMPT = "The capital of France is"


@pytest.fixture
def http() -> Client:
    return Client()


def post(http: Client, path: str, body: dict):
    return http.post(path, data=json.dumps(body), content_type="application/json")


def test_props_has_llama_servers_fields(http, served, smollm2_service):
    response = http.get("/props")
    assert response.status_code == 200, response.content
    props = response.json()
    settings = props["default_generation_settings"]
    assert settings["n_ctx"] == smollm2_service.context_window
    assert {"temperature", "top_k", "top_p", "min_p", "n_predict", "stop"} <= set(
        settings["params"]
    )
    assert props["total_slots"] == smollm2_service.max_concurrent
    # The file's name; its full path for an operator (no key configured here: everyone)
    assert props["model_path"] == smollm2_service.path
    assert props["chat_template"] == smollm2_service.template.source
    assert props["modalities"]["vision"] is False and props["is_sleeping"] is False
    assert http.post("/props").status_code == 405


def test_slots_lists_each_slot(http, served, smollm2_service):
    response = http.get("/slots")
    assert response.status_code == 200, response.content
    slots = response.json()
    assert [slot["id"] for slot in slots] == list(range(smollm2_service.max_concurrent))
    assert all(slot["is_processing"] is False for slot in slots)
    assert all(slot["n_ctx"] == smollm2_service.context_window for slot in slots)
    assert http.get("/slots?fail_on_no_slot=1").status_code == 200


def test_completion_is_the_raw_prompt_completed(http, served):
    body = {"prompt": PROMPT, "n_predict": 12, "temperature": 0}
    response = post(http, "/completion", body)
    assert response.status_code == 200, response.content
    answer = response.json()
    assert answer["stop"] is True and answer["model"] == MODEL
    assert answer["tokens_predicted"] <= 12 and answer["stop_type"] in {"eos", "limit"}
    assert answer["prompt"] == PROMPT and answer["tokens_evaluated"] > 0
    assert answer["generation_settings"]["n_predict"] == 12
    assert {"prompt_n", "prompt_ms", "predicted_n", "predicted_ms"} <= set(answer["timings"])
    same = post(
        http, "/v1/completions", {"prompt": PROMPT, "max_tokens": 12, "temperature": 0}
    ).json()
    assert answer["content"] == same["choices"][0]["text"]


@pytest.mark.anyio
async def test_completion_streams_the_same_text(client, served):
    body = {"prompt": PROMPT, "n_predict": 12, "temperature": 0}
    answer = (
        await client.post("/completion", data=json.dumps(body), content_type="application/json")
    ).json()
    streamed = await client.post(
        "/completion", data=json.dumps({**body, "stream": True}), content_type="application/json"
    )
    assert streamed["Content-Type"].startswith("text/event-stream")
    raw = b"".join([piece async for piece in streamed.streaming_content]).decode()
    chunks = [json.loads(line[6:]) for line in raw.splitlines() if line.startswith("data: ")]
    assert all(chunk["stop"] is False for chunk in chunks[:-1]) and chunks[-1]["stop"] is True
    assert "".join(chunk["content"] for chunk in chunks) == answer["content"]
    assert chunks[-1]["stop_type"] == answer["stop_type"]


def test_completion_stop_word_and_refusals(http, served):
    answer = post(
        http, "/completion", {"prompt": PROMPT, "n_predict": 16, "temperature": 0, "stop": [" "]}
    ).json()
    assert answer["stop_type"] == "word" and answer["stopping_word"] == " "
    for bad in ({}, {"prompt": 3}, {"prompt": ["a", "b"]}, {"prompt": "x", "top_k": "many"}):
        response = post(http, "/completion", bad)
        assert response.status_code == 400, (bad, response.content)
        assert response.json()["error"]["type"] == "invalid_request_error"


def test_infill_on_a_model_without_fim_tokens_is_refused(http, served):
    response = post(http, "/infill", {"input_prefix": "def f(", "input_suffix": "):\n"})
    assert response.status_code == 400, response.content  # llama-server: 501
    error = response.json()["error"]
    assert error["type"] == "not_supported_error"
    assert error["message"].startswith("Infill is not supported by this model")


def test_the_infill_prompt_is_llama_servers_layout(smollm2_service):
    tokenizer = smollm2_service.tokenizer
    fim = {"pre": 10, "suf": 11, "mid": 12}
    metadata = {f"tokenizer.ggml.fim_{role}_token_id": i for role, i in fim.items()}
    body = {
        "input_prefix": "def add(a, b):\n    return ",
        "input_suffix": "\n",
        "prompt": "a",
        "input_extra": [{"filename": "x.py", "text": "X = 1\n"}],
    }
    ids = list(parse_infill(body, metadata, tokenizer, 8192).prompt)
    if tokenizer.add_bos:
        ids = ids[1:]
    pre, suf, mid = ids.index(10), ids.index(11), ids.index(12)
    # SmolLM2 has the repo-level tokens (<repo_name>, <file_sep>): each extra chunk is a
    # file of the project, then <pre>prefix<suf>suffix<mid>prompt.
    assert tokenizer.decode(ids[:pre]) == (
        "<repo_name>myproject\n<file_sep>x.py\nX = 1\n<file_sep>filename\n"
    )
    assert tokenizer.decode(ids[pre + 1 : suf]) == body["input_prefix"]
    assert tokenizer.decode(ids[suf + 1 : mid]) == "\n"
    assert tokenizer.decode(ids[mid + 1 :]) == "a"
