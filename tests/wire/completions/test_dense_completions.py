"""POST /v1/completions serves each dense architecture's tiny GGUF (granite, olmo2, phi3,
gemma2, smollm3; tests/reference/tiny) with the float32 transformers reference's greedy
tokens, from the reference's own prompt ids, up to its first near tie."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from django.test import Client

from engine import ModelConfig, ModelService

TINY = Path(__file__).resolve().parents[2] / "reference" / "tiny"
ARCHS = ["granite", "olmo2", "phi3", "gemma2", "smollm3"]
STEPS = 8


@pytest.fixture(scope="module")
def references() -> dict:
    data = json.loads((TINY / "tiny_dense_f32.json").read_text("utf-8"))
    return {m["gguf"]: m for m in data["models"]}


@pytest.mark.parametrize("arch", ARCHS)
def test_completions_give_the_reference_greedy_tokens(arch, references, empty_runtime):
    name = f"tiny-{arch}"
    service = ModelService.load(
        # A window within phi3's original 4096: its short LongRoPE factors, as the
        # reference (transformers) uses for sequences of that length.
        ModelConfig(name=name, path=str(TINY / f"{name}.gguf"), prefix_cache=False, ctx_cap=4096)
    )
    try:
        empty_runtime.register(name, service)
        http = Client(enforce_csrf_checks=True)
        for case in references[f"{name}.gguf"]["cases"]:
            expected, margins = case["greedy_ids"][:STEPS], case["top1_top2_margin"]
            n = next((i for i, m in enumerate(margins[:STEPS]) if m < 0.05), STEPS)
            body = {
                "model": name,
                "prompt": case["prompt_ids"],
                "max_tokens": n,
                "temperature": 0,
                "ignore_eos": True,
            }
            response = http.post(
                "/v1/completions", data=json.dumps(body), content_type="application/json"
            )
            assert response.status_code == 200, response.content
            text = response.json()["choices"][0]["text"]
            assert text == service.tokenizer.decode(expected[:n]), case["prompt_ids"]
    finally:
        service.close()
