"""gpt-oss served in-process (Django's client): the tiny gpt-oss file
(tests/reference/tiny) loads and answers /v1/completions greedily with the float32
reference's tokens, its top-5 logprobs the reference's logits less one constant."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.test import Client

TINY = Path(__file__).resolve().parents[2] / "reference" / "tiny"
NAME = "tiny-gptoss"
MARGIN_FLOOR = 0.05


@pytest.fixture(scope="module")
def gptoss_service():
    from engine.serving.service import ModelService
    from engine.types import ModelConfig

    path = TINY / "tiny-gptoss.gguf"
    svc = ModelService.load(ModelConfig(name=NAME, path=str(path), prefix_cache=False))
    yield svc
    svc.close()


@pytest.fixture
def served_gptoss(empty_runtime, gptoss_service):
    empty_runtime.register(NAME, gptoss_service)
    yield empty_runtime
    for info in gptoss_service.session_info():
        gptoss_service.release_session(info.session_id)


def test_gpt_oss_answers_completions_with_the_references_top5(served_gptoss, gptoss_service):
    ref = json.loads((TINY / "tiny_gptoss_f32.json").read_text("utf-8"))["models"][0]
    case = ref["cases"][2]  # 18 greedy steps before a near tie
    margins = case["top1_top2_margin"]
    n = next((i for i, m in enumerate(margins) if m < MARGIN_FLOOR), len(margins))
    body = {
        "model": NAME,
        "prompt": case["prompt_ids"],
        "max_tokens": n,
        "temperature": 0,
        "logprobs": 5,
    }
    response = Client().post("/v1/completions", json.dumps(body), content_type="application/json")
    assert response.status_code == 200, response.content
    choice = response.json()["choices"][0]
    tokenizer = gptoss_service.tokenizer
    assert choice["text"] == tokenizer.decode(case["greedy_ids"][:n])
    # The first step's top-5: the reference's ids, logprobs = logits - logsumexp.
    top = choice["logprobs"]["top_logprobs"][0]
    names = [tokenizer.decode([i]) for i in case["last_logits_top5_ids"]]
    assert set(top) == set(names)
    shift = top[names[0]] - case["last_logits_top5"][0]
    for name, logit in zip(names, case["last_logits_top5"], strict=True):
        assert abs(top[name] - logit - shift) < 1e-2, name
