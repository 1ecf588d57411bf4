"""A tiny llama GGUF written by the test goes through the same load and forward path."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from engine.serving.service import ModelService
from engine.types import (
    FinishEvent,
    GenerationFailed,
    GenerationRequest,
    ModelConfig,
    SamplingParams,
)
from tests.tiny_gguf import write_tiny_llama


async def run_to_end(svc: ModelService, prompt: list[int], max_tokens: int = 5):
    events = []
    async for ev in svc.generate(
        GenerationRequest("t", tuple(prompt), SamplingParams(temperature=0, max_tokens=max_tokens))
    ):
        events.append(ev)
    return events


def test_a_tiny_llama_loads_and_generates(tmp_path):
    svc = ModelService.load(
        ModelConfig(name="tiny", path=str(write_tiny_llama(tmp_path / "t.gguf")))
    )
    try:
        assert svc.architecture == "llama"
        assert svc.context_window == 256  # the file's context length, under the 8192 cap
        prompt = svc.encode_chat([{"role": "user", "content": "hi"}])
        events = asyncio.run(run_to_end(svc, prompt))
        assert isinstance(events[-1], FinishEvent)
        # Incremental (KV cache) decoding equals recomputing the whole sequence each step.
        kv = svc.model.make_kv_cache(1, 64)
        seq = list(prompt)
        step = svc.model.forward(np.asarray(seq), 0, kv, 0)
        for _ in range(4):
            full = svc.model.forward(np.asarray(seq), 0, svc.model.make_kv_cache(1, 64), 0)
            np.testing.assert_allclose(step, full, atol=1e-4)
            token = int(np.argmax(full))
            step = svc.model.forward(np.asarray([token]), len(seq), kv, 0)
            seq.append(token)
    finally:
        svc.close()


def test_a_failing_forward_pass_is_a_generation_failure_and_frees_the_model(tmp_path):
    path = write_tiny_llama(tmp_path / "broken.gguf", broken_ffn_down=True)
    svc = ModelService.load(ModelConfig(name="broken", path=str(path)))
    try:
        prompt = svc.encode_chat([{"role": "user", "content": "hi"}])
        for _ in range(2):  # the second try is not refused as busy
            with pytest.raises(GenerationFailed, match="generation failed"):
                asyncio.run(run_to_end(svc, prompt))
    finally:
        svc.close()
