"""Mixture-of-experts models served in-process (Django's client): each tiny file
(tests/reference/tiny: qwen3moe, gpt-oss) loads and answers /v1/completions greedily with
its float32 reference's tokens, its top-5 logprobs the reference's logits less one
constant."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.test import Client

TINY = Path(__file__).resolve().parents[2] / "reference" / "tiny"
MARGIN_FLOOR = 0.05
# Served name: (GGUF, its float32 reference, the reference case checked).
MODELS = {
    "tiny-qwen3moe": ("tiny-qwen3moe.gguf", "tiny_moe_f32.json", 0),
    "tiny-gptoss": ("tiny-gptoss.gguf", "tiny_gptoss_f32.json", 2),  # 18 steps before a tie
}


@pytest.fixture(scope="module", params=sorted(MODELS))
def moe_service(request):
    from engine.serving.service import ModelService
    from engine.types import ModelConfig

    path = TINY / MODELS[request.param][0]
    svc = ModelService.load(ModelConfig(name=request.param, path=str(path), prefix_cache=False))
    yield svc
    svc.close()


@pytest.fixture
def served_moe(empty_runtime, moe_service):
    empty_runtime.register(moe_service.name, moe_service)
    yield empty_runtime
    for info in moe_service.session_info():
        moe_service.release_session(info.session_id)


def test_a_mixture_answers_completions_with_the_references_top5(served_moe, moe_service):
    name = moe_service.name
    _, reference, index = MODELS[name]
    ref = json.loads((TINY / reference).read_text("utf-8"))["models"][0]
    case = ref["cases"][index]
    margins = case["top1_top2_margin"]
    n = next((i for i, m in enumerate(margins) if m < MARGIN_FLOOR), len(margins))
    body = {
        "model": name,
        "prompt": case["prompt_ids"],
        "max_tokens": n,
        "temperature": 0,
        "logprobs": 5,
    }
    response = Client().post("/v1/completions", json.dumps(body), content_type="application/json")
    assert response.status_code == 200, response.content
    choice = response.json()["choices"][0]
    tokenizer = moe_service.tokenizer
    assert choice["text"] == tokenizer.decode(case["greedy_ids"][:n])
    # The first step's top-5: the reference's ids, logprobs = logits - logsumexp.
    top = choice["logprobs"]["top_logprobs"][0]
    names = [tokenizer.decode([i]) for i in case["last_logits_top5_ids"]]
    assert set(top) == set(names)
    shift = top[names[0]] - case["last_logits_top5"][0]
    for token, logit in zip(names, case["last_logits_top5"], strict=True):
        assert abs(top[token] - logit - shift) < 1e-2, token
