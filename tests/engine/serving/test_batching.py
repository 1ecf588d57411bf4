"""Continuous batching on the real SmolLM2: streams share decode passes, every request gets
the same tokens alone or beside seven others, the queue and its refusals, n > 1 and the
memory ladder."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from engine.types import (
    FinishEvent,
    GenerationRequest,
    ModelConfig,
    SamplingParams,
    ServerBusy,
    ServerMemoryConstrained,
    TokenEvent,
)

TOPICS = ["the sea", "a cat", "mountains", "coffee", "the moon", "a library", "rain", "trains"]


@pytest.fixture(scope="module")
def eight(smollm2_service):
    """The session's SmolLM2 weights served with eight slots."""
    svc = smollm2_service.sibling(
        ModelConfig(name="eight", path=smollm2_service.path, max_concurrent=8)
    )
    yield svc
    svc.close()


@pytest.fixture
def decode_rows(eight, monkeypatch) -> list[int]:
    """The number of rows of each decode pass the engine runs (a spy on the runner)."""
    rows: list[int] = []
    real_run = eight.runner.run

    def run(batch, samplers, *drafts):
        if batch.decode:
            rows.append(len(batch.decode))
        return real_run(batch, samplers, *drafts)

    monkeypatch.setattr(eight.runner, "run", run)
    return rows


def service_with(svc, **config):
    return svc.sibling(ModelConfig(name="x", path=svc.path, **config))


async def collect(svc, prompt, params, n=1):
    """({index: text}, {index: FinishEvent}) of one request."""
    texts: dict[int, str] = {}
    finishes: dict[int, FinishEvent] = {}
    async for ev in svc.generate(GenerationRequest("t", tuple(prompt), params, n=n)):
        if isinstance(ev, TokenEvent):
            texts[ev.index] = texts.get(ev.index, "") + ev.text
        else:
            finishes[ev.index] = ev
    return texts, finishes


def answer(result) -> tuple:
    """A collect() result without what may differ run to run: the timings, and the prompt
    tokens the prefix cache reused (the KV kept in a slot from an earlier request)."""
    texts, finishes = result
    return texts, {
        i: (f.finish_reason, replace(f.usage, cached_tokens=0), f.tool_calls)
        for i, f in finishes.items()
    }


def prompts(svc) -> list[list[int]]:
    return [
        svc.encode_chat([{"role": "user", "content": f"Write one sentence about {topic}."}])
        for topic in TOPICS
    ]


@pytest.mark.parametrize(
    "params",
    [
        SamplingParams(temperature=0, max_tokens=14),
        SamplingParams(temperature=1.0, top_k=0, top_p=1.0, seed=1234, max_tokens=14),
    ],
    ids=["greedy", "seeded-temperature-1"],
)
def test_eight_concurrent_requests_equal_the_same_requests_one_at_a_time(
    eight, decode_rows, params
):
    ids = prompts(eight)
    alone = [asyncio.run(collect(eight, p, params)) for p in ids]
    assert max(decode_rows) == 1
    decode_rows.clear()

    async def together():
        return await asyncio.gather(*(collect(eight, p, params) for p in ids))

    started = time.perf_counter()
    batched = asyncio.run(together())
    elapsed = time.perf_counter() - started
    assert max(decode_rows) == 8, decode_rows  # they really shared decode passes
    for (text_a, fin_a), (text_b, fin_b) in zip(alone, batched, strict=True):
        assert text_a == text_b
        # Usage alike but for the prefix cache: the shared chat template's KV, kept in
        # the slots from the first round, is reused by the second.
        assert replace(fin_a[0].usage, cached_tokens=0) == replace(fin_b[0].usage, cached_tokens=0)
    assert len({t[0] for t, _ in batched}) > 1  # eight different answers, not one
    assert elapsed < 60


def test_the_batched_forward_computes_each_row_exactly_as_alone(eight):
    model, kv = eight.model, eight.model.make_kv_cache(8, 64)
    rng = np.random.default_rng(1)
    lengths = [3 + 2 * b for b in range(8)]
    for slot, n in enumerate(lengths):
        model.forward(rng.integers(0, 49152, size=n), 0, kv, slot)
    tokens = [int(t) for t in rng.integers(0, 49152, size=8)]
    saved = kv.k.copy(), kv.v.copy()
    batched = model.forward_decode(tokens, lengths, list(range(8)), kv)
    for b in range(8):
        kv.k[...], kv.v[...] = saved
        alone = model.forward_decode([tokens[b]], [lengths[b]], [b], kv)
        assert np.array_equal(alone[0], batched[b]), b
    # Same numbers as the prefill-style forward for one token (it is a GEMV too).
    kv.k[...], kv.v[...] = saved
    np.testing.assert_allclose(
        model.forward(np.array([tokens[0]]), lengths[0], kv, 0), batched[0], atol=1e-4
    )


def test_n_choices_share_the_prefill_and_choice_i_samples_with_seed_plus_i(eight):
    ids = eight.encode_chat([{"role": "user", "content": "Name a colour."}])
    params = SamplingParams(temperature=1.0, seed=7, max_tokens=6)
    texts, finishes = asyncio.run(collect(eight, ids, params, n=3))
    assert sorted(texts) == sorted(finishes) == [0, 1, 2]
    assert {f.choices for f in finishes.values()} == {3}
    for i in range(3):
        one, _ = asyncio.run(
            collect(eight, ids, SamplingParams(temperature=1.0, seed=7 + i, max_tokens=6))
        )
        assert one[0] == texts[i]
    assert {f.usage.prompt_tokens for f in finishes.values()} == {len(ids)}


def test_overflow_waits_in_the_queue_and_a_full_queue_is_refused_with_retry_after(
    smollm2_service,
):
    svc = service_with(smollm2_service, max_concurrent=1, queue_depth=1)
    ids = svc.encode_chat([{"role": "user", "content": "Count to twenty."}])
    long = SamplingParams(temperature=0, max_tokens=12)

    async def scenario():
        running = svc.generate(GenerationRequest("a", tuple(ids), long))
        await running.__anext__()  # it holds the only slot
        waiting = asyncio.create_task(
            collect(svc, ids, SamplingParams(temperature=0, max_tokens=3))
        )
        while svc.queued == 0:
            await asyncio.sleep(0.01)
        assert svc.in_flight == 2
        with pytest.raises(ServerBusy) as refused:
            await collect(svc, ids, long)
        assert 1 <= refused.value.retry_after <= 30
        async for _ in running:  # the running one finishes, then the queued one runs
            pass
        texts, finishes = await asyncio.wait_for(waiting, 60)
        assert finishes[0].usage.completion_tokens == 3

    try:
        asyncio.run(scenario())
        assert svc.in_flight == 0
    finally:
        svc.close()


def test_a_queued_request_whose_client_left_frees_its_place(smollm2_service):
    svc = service_with(smollm2_service, max_concurrent=1, queue_depth=1)
    ids = svc.encode_chat([{"role": "user", "content": "Count to twenty."}])
    params = SamplingParams(temperature=0, max_tokens=20)

    async def scenario():
        running = svc.generate(GenerationRequest("a", tuple(ids), params))
        await running.__anext__()
        queued = asyncio.create_task(collect(svc, ids, params))
        while svc.queued == 0:
            await asyncio.sleep(0.01)
        queued.cancel()  # the client hung up while waiting
        with pytest.raises(asyncio.CancelledError):
            await queued
        assert svc.queued == 0
        # Its place is free: the next request queues instead of being refused.
        waiting = asyncio.create_task(
            collect(svc, ids, SamplingParams(temperature=0, max_tokens=1))
        )
        while svc.queued == 0:
            await asyncio.sleep(0.01)
        await running.aclose()
        await asyncio.wait_for(waiting, 60)

    try:
        asyncio.run(scenario())
    finally:
        svc.close()


def test_a_request_waiting_past_the_queue_timeout_is_refused_as_busy(smollm2_service):
    svc = service_with(smollm2_service, max_concurrent=1, queue_depth=4, queue_timeout_s=0.5)
    ids = svc.encode_chat([{"role": "user", "content": "Count to twenty."}])

    async def scenario():
        # The slot must stay taken past the timeout, however fast the host decodes: a
        # long story with no end of turn and no drafting (a count ended in 0.44 s, as a
        # repetition loop, once decode ran at ~4.5 ms a token).
        story = svc.encode_chat([{"role": "user", "content": "Write a long story about a ship."}])
        running = svc.generate(
            GenerationRequest(
                "a",
                tuple(story),
                SamplingParams(temperature=0, max_tokens=2000, ignore_eos=True),
                speculation="off",
            )
        )
        await running.__anext__()
        started = time.monotonic()
        with pytest.raises(ServerBusy, match="no slot became free within 0.5 s"):
            await collect(svc, ids, SamplingParams(max_tokens=1))
        waited = time.monotonic() - started
        await running.aclose()
        return waited

    try:
        assert 0.5 <= asyncio.run(scenario()) < 5
    finally:
        svc.close()


def test_memory_pressure_lowers_the_served_numbers_and_refuses_what_no_longer_fits(
    smollm2_service,
):
    svc = service_with(smollm2_service, max_concurrent=4)
    try:
        svc.simulate_memory_pressure(3)  # critical
        assert (svc.max_concurrent, svc.context_window) == (1, 2048)
        assert (svc.max_concurrent_configured, svc.context_window_configured) == (4, 8192)
        with pytest.raises(ServerMemoryConstrained) as refused:
            asyncio.run(collect(svc, [1] * 3000, SamplingParams(max_tokens=1)))
        assert refused.value.retry_after >= 1
        ids = svc.encode_chat([{"role": "user", "content": "Hi"}])
        _, finishes = asyncio.run(collect(svc, ids, SamplingParams(temperature=0, max_tokens=2)))
        assert finishes[0].usage.kv_cap == 2048
        svc.simulate_memory_pressure(None)  # pressure clears (this machine has memory)
        assert (svc.max_concurrent, svc.context_window) == (4, 8192)
        _, finishes = asyncio.run(collect(svc, ids, SamplingParams(temperature=0, max_tokens=2)))
        assert finishes[0].usage.kv_cap == 8192
    finally:
        svc.close()


def test_a_qwen2_service_shares_decode_passes_and_answers_as_alone():
    path = Path(__file__).resolve().parents[2] / "reference" / "tiny" / "tiny-qwen2.gguf"
    if not path.is_file():
        pytest.skip("tests/reference/tiny/tiny-qwen2.gguf is not in this checkout")
    from engine.serving.service import ModelService

    svc = ModelService.load(ModelConfig(name="qwen", path=str(path), max_concurrent=4))
    rows: list[int] = []
    decode = svc.runner._decode
    svc.runner._decode = lambda batch, states: rows.append(len(batch)) or decode(batch, states)
    params = SamplingParams(temperature=1.0, seed=5, max_tokens=8)
    prompts = [[1, 2, 3, 4 + i] for i in range(4)]

    async def together():
        return await asyncio.gather(*(collect(svc, p, params) for p in prompts))

    try:
        alone = [asyncio.run(collect(svc, p, params)) for p in prompts]
        assert [answer(r) for r in asyncio.run(together())] == [answer(r) for r in alone]
        assert max(rows) == 4, rows  # the four streams really shared decode passes
    finally:
        svc.close()
