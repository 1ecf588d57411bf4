"""The engine thread and its asyncio bridge, on the real SmolLM2."""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from inference.engine.types import (
    ContextOverBudget,
    FinishEvent,
    GenerationRequest,
    SamplingParams,
    ServerBusy,
    TokenEvent,
)

GREEDY = SamplingParams(temperature=0, max_tokens=16)


def run(coro):
    return asyncio.run(coro)


@pytest.fixture(autouse=True)
def idle_model(smollm2_service):
    """An aborted generation frees the model at its next token: start each test on an idle one."""
    deadline = time.monotonic() + 10
    while smollm2_service.busy and time.monotonic() < deadline:
        time.sleep(0.02)
    assert not smollm2_service.busy


async def collect(svc, prompt, params=GREEDY):
    text, finish = [], None
    async for ev in svc.generate(GenerationRequest("t", tuple(prompt), params)):
        if isinstance(ev, TokenEvent):
            text.append(ev.text)
        else:
            finish = ev
    return "".join(text), finish


def test_chat_prompt_renders_to_the_reference_ids(smollm2_service, smollm2_f32):
    case = smollm2_f32["greedy"][0]
    prompt_ids = case["prompt_ids"]
    prompt_ids = json.loads(prompt_ids) if isinstance(prompt_ids, str) else prompt_ids
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    assert smollm2_service.encode_chat(messages) == prompt_ids


def test_greedy_generation_stops_at_end_of_turn(smollm2_service):
    ids = smollm2_service.encode_chat(
        [{"role": "user", "content": "What is the capital of France?"}]
    )
    text, finish = run(collect(smollm2_service, ids, SamplingParams(temperature=0, max_tokens=64)))
    assert text == "The capital of France is Paris."
    assert finish.finish_reason == "stop"
    assert finish.usage.prompt_tokens == len(ids)
    assert finish.usage.completion_tokens == 7  # end-of-turn is not counted as output text
    assert finish.usage.kv_cap == smollm2_service.context_window


def test_max_tokens_ends_with_length(smollm2_service):
    ids = smollm2_service.encode_chat([{"role": "user", "content": "Write a long poem."}])
    _, finish = run(collect(smollm2_service, ids, SamplingParams(temperature=0, max_tokens=3)))
    assert finish.finish_reason == "length"
    assert finish.usage.completion_tokens == 3


def test_a_stop_string_ends_generation_and_is_not_returned(smollm2_service):
    ids = smollm2_service.encode_chat(
        [{"role": "user", "content": "What is the capital of France?"}]
    )
    params = SamplingParams(temperature=0, max_tokens=32, stop=(" Par",))
    text, finish = run(collect(smollm2_service, ids, params))
    assert text == "The capital of France is"
    assert finish.finish_reason == "stop"


def test_a_prompt_over_the_window_is_refused_before_any_work(smollm2_service):
    too_long = [1] * (smollm2_service.context_window + 1)
    with pytest.raises(ContextOverBudget) as info:
        run(collect(smollm2_service, too_long))
    assert info.value.kv_cap == smollm2_service.context_window


def test_a_second_generation_while_one_runs_is_refused_as_busy(smollm2_service):
    ids = smollm2_service.encode_chat([{"role": "user", "content": "Tell me a story."}])

    async def scenario():
        first = smollm2_service.generate(
            GenerationRequest("a", tuple(ids), SamplingParams(temperature=0, max_tokens=64))
        )
        await first.__anext__()
        try:
            with pytest.raises(ServerBusy):
                await collect(smollm2_service, ids)
        finally:
            await first.aclose()

    run(scenario())


def test_closing_the_stream_early_aborts_and_frees_the_model(smollm2_service):
    ids = smollm2_service.encode_chat([{"role": "user", "content": "Tell me a story."}])

    async def scenario():
        gen = smollm2_service.generate(
            GenerationRequest("a", tuple(ids), SamplingParams(temperature=0, max_tokens=1000))
        )
        await gen.__anext__()
        await gen.aclose()
        # The engine notices within a token; then the model takes new work.
        for _ in range(100):
            try:
                return await collect(
                    smollm2_service, ids, SamplingParams(temperature=0, max_tokens=2)
                )
            except ServerBusy:
                await asyncio.sleep(0.05)
        raise AssertionError("the aborted generation never released the model")

    _, finish = run(scenario())
    assert isinstance(finish, FinishEvent)
