"""The engine thread and its asyncio bridge, on the real SmolLM2."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace

import pytest

from engine.types import (
    ContextOverBudget,
    FinishEvent,
    GenerationRequest,
    ModelConfig,
    SamplingParams,
    TokenEvent,
)

GREEDY = SamplingParams(temperature=0, max_tokens=16)


def run(coro):
    return asyncio.run(coro)


@pytest.fixture(autouse=True)
def idle_model(idle_smollm2):
    """Each test starts on an idle model (tests/conftest.py wait_idle)."""


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


def test_the_served_numbers_default_to_the_configured_ones(smollm2_service):
    # PANTHEON_MAX_CONCURRENT=0 means max_sessions (the contract); nothing clamps them.
    assert smollm2_service.max_concurrent == smollm2_service.max_concurrent_configured == 4
    assert smollm2_service.context_window == smollm2_service.context_window_configured
    assert smollm2_service.kv.n_slots == 4


def test_closing_the_stream_early_aborts_and_frees_the_slot(smollm2_service):
    svc = smollm2_service.sibling(
        ModelConfig(name="one-slot", path=smollm2_service.path, max_concurrent=1, queue_depth=0)
    )
    ids = svc.encode_chat([{"role": "user", "content": "Tell me a story."}])

    async def scenario():
        gen = svc.generate(
            GenerationRequest("a", tuple(ids), SamplingParams(temperature=0, max_tokens=1000))
        )
        await gen.__anext__()
        await gen.aclose()
        # The slot is freed at once; the next request takes it.
        return await collect(svc, ids, SamplingParams(temperature=0, max_tokens=2))

    try:
        _, finish = run(scenario())
        assert isinstance(finish, FinishEvent)
        assert not svc.busy
    finally:
        svc.close()


async def collect_choices(svc, prompt, params, n):
    """({index: text}, {index: FinishEvent}) of one request of `n` choices."""
    texts: dict[int, str] = {}
    finishes: dict[int, FinishEvent] = {}
    async for ev in svc.generate(GenerationRequest("n", tuple(prompt), params, n=n)):
        if isinstance(ev, TokenEvent):
            assert ev.index not in finishes  # nothing of a choice after its finish
            texts[ev.index] = texts.get(ev.index, "") + ev.text
        else:
            assert ev.index not in finishes
            finishes[ev.index] = ev
    return texts, finishes


def test_n_above_the_served_slots_runs_every_choice_as_the_slots_free(smollm2_service):
    """n = 4 on 2 slots, nothing else running: four choices, each its own index and
    FinishEvent, choice i the same decode as a single request with seed + i."""
    svc = smollm2_service.sibling(
        ModelConfig(name="two-slots", path=smollm2_service.path, max_concurrent=2)
    )
    ids = svc.encode_chat([{"role": "user", "content": "Name a colour."}])
    params = SamplingParams(temperature=1.0, seed=7, max_tokens=5)
    try:
        texts, finishes = run(collect_choices(svc, ids, params, n=4))
        assert sorted(finishes) == [0, 1, 2, 3]
        assert {f.choices for f in finishes.values()} == {4}
        assert {f.usage.prompt_tokens for f in finishes.values()} == {len(ids)}
        for i in range(4):
            alone, _ = run(collect_choices(svc, ids, replace(params, seed=7 + i), n=1))
            assert alone.get(0, "") == texts.get(i, ""), i
        assert len(set(texts.values())) > 1  # four samples, not one copied
        assert not svc.busy and svc.scheduler.running == 0
    finally:
        svc.close()


def test_a_request_queued_behind_waiting_choices_still_runs(smollm2_service):
    svc = smollm2_service.sibling(
        ModelConfig(name="two-slots", path=smollm2_service.path, max_concurrent=2)
    )
    ids = svc.encode_chat([{"role": "user", "content": "Name a colour."}])
    params = SamplingParams(temperature=0, max_tokens=3)

    async def together():
        return await asyncio.gather(
            collect_choices(svc, ids, params, n=4), collect_choices(svc, ids, params, n=1)
        )

    try:
        (_, many), (_, one) = run(together())
        assert sorted(many) == [0, 1, 2, 3] and sorted(one) == [0]
    finally:
        svc.close()


def token_events(svc, prompt, params, interval_s: float) -> list[TokenEvent]:
    """A greedy request's token events, its model's stream interval set for it."""

    async def collect_events():
        request = GenerationRequest("t", tuple(prompt), params, speculation="off")
        return [ev async for ev in svc.generate(request) if isinstance(ev, TokenEvent)]

    loop = svc.engine_loop
    saved, loop.stream_interval_s = loop.stream_interval_s, interval_s
    try:
        return run(collect_events())
    finally:
        loop.stream_interval_s = saved


def test_the_stream_interval_joins_tokens_not_text(smollm2_service):
    """Tokens decoded within the stream interval leave as one event: the first at once,
    the rest with the finish here; the same ids and text as one event per step."""
    ids = smollm2_service.encode_chat([{"role": "user", "content": "Count to twenty."}])
    params = SamplingParams(temperature=0, max_tokens=24, ignore_eos=True)
    every_step = token_events(smollm2_service, ids, params, 0.0)
    paced = token_events(smollm2_service, ids, params, 60.0)
    assert [len(ev.token_ids) for ev in every_step] == [1] * 24
    assert [len(ev.token_ids) for ev in paced] == [1, 23]
    assert [t for ev in paced for t in ev.token_ids] == [
        t for ev in every_step for t in ev.token_ids
    ]
    assert "".join(ev.text for ev in paced) == "".join(ev.text for ev in every_step)
