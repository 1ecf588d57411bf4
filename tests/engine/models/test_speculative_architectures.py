"""Every architecture serves the same greedy and seeded tokens with speculation off, auto
(prompt lookup) and with the answer as its prediction (every draft accepted), on the
numpy and the compiled CPU backends (serving/speculation.py)."""

from __future__ import annotations

import asyncio
from dataclasses import replace

import pytest

from engine.serving.service import ModelService
from engine.types import FinishEvent, GenerationRequest, ModelConfig, SamplingParams, TokenEvent
from tests.engine.models.test_batch_invariance import TINY
from tests.tiny_gguf import write_tiny_llama

PROMPT = (5, 6, 7, 8, 9, 5, 6, 7, 8, 9, 5, 6, 7)  # a pattern prompt lookup can continue
PARAMS = [
    SamplingParams(temperature=0, max_tokens=24),
    SamplingParams(temperature=0.9, top_p=0.9, top_k=0, seed=3, max_tokens=24),
]


async def _generate(svc, request):
    ids, finish = [], None
    async for ev in svc.generate(request):
        if isinstance(ev, TokenEvent):
            ids.extend(ev.token_ids)
        elif isinstance(ev, FinishEvent):
            finish = ev
    return ids, finish


def generate(svc, prompt, params, **spec):
    return asyncio.run(_generate(svc, GenerationRequest("t", tuple(prompt), params, **spec)))


def check_exact(svc, prompt=PROMPT, max_tokens: int = 24) -> None:
    for params in PARAMS:
        params = replace(params, max_tokens=max_tokens)
        off, fin_off = generate(svc, prompt, params, speculation="off")
        assert len(off) >= 3, off  # long enough to draft
        auto, fin_auto = generate(svc, prompt, params)
        assert auto == off
        accepted = svc.stats.accepted_draft_tokens
        predicted, fin_pred = generate(svc, prompt, params, prediction=tuple(off))
        assert predicted == off
        assert fin_pred.usage.accepted_prediction_tokens > 0
        assert svc.stats.accepted_draft_tokens > accepted  # the drafts were verified
        for fin in (fin_auto, fin_pred):
            assert fin.finish_reason == fin_off.finish_reason
            assert fin.usage.completion_tokens == fin_off.usage.completion_tokens
            assert fin.usage.kv_used == fin_off.usage.kv_used


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory):
    return write_tiny_llama(tmp_path_factory.mktemp("spec-arch") / "tiny-llama.gguf", seed=2)


@pytest.mark.parametrize("backend", ["numpy", "cpu"])
@pytest.mark.parametrize("name", ["tiny-llama", "tiny-qwen2.gguf", "tiny-qwen3.gguf"])
def test_speculation_does_not_change_the_tokens(name, backend, tiny_llama):
    path = tiny_llama if name == "tiny-llama" else TINY / name
    if not path.is_file():
        pytest.skip(f"{path.name} is not in this checkout")
    try:
        svc = ModelService.load(ModelConfig(name="t", path=str(path), backend=backend))
    except Exception as exc:  # the compiled kernels are not built here
        if backend == "cpu":
            pytest.skip(f"no cpu backend: {exc}")
        raise
    try:
        check_exact(svc)
    finally:
        svc.close()


def test_gemma3_speculation_does_not_change_the_tokens(gemma3_path):
    svc = ModelService.load(ModelConfig(name="g", path=str(gemma3_path)))
    try:
        prompt = svc.encode_chat([{"role": "user", "content": "Count from one to twenty."}])
        check_exact(svc, prompt, max_tokens=12)
    finally:
        svc.close()
