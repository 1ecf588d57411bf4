"""The engine's timings on a FinishEvent (what the metrics observe): queue wait, first
token, decode."""

from __future__ import annotations

import asyncio

from engine.types import FinishEvent, GenerationRequest, ModelConfig, SamplingParams


def test_a_request_behind_a_full_slot_reports_its_wait(smollm2_service):
    svc = smollm2_service.sibling(
        ModelConfig(name="one-slot", path=smollm2_service.path, max_concurrent=1, queue_depth=1)
    )
    ids = tuple(svc.encode_chat([{"role": "user", "content": "Count to ten."}]))

    async def finish_of(request_id: str, started: asyncio.Event | None = None) -> FinishEvent:
        params = SamplingParams(temperature=0, max_tokens=12)
        async for event in svc.generate(GenerationRequest(request_id, ids, params)):
            if started is not None:
                started.set()
            if isinstance(event, FinishEvent):
                return event
        raise AssertionError("no finish")

    async def scenario():
        running = asyncio.Event()
        first = asyncio.create_task(finish_of("first", running))
        await running.wait()  # the first holds the only slot: the second queues
        second = await finish_of("second")
        return await first, second

    try:
        first, second = asyncio.run(scenario())
    finally:
        svc.close()
    # The second waited in the queue for the whole of the first's generation; the first
    # for one engine step at most.
    assert second.queue_wait_s > first.queue_wait_s
    for finish in (first, second):
        assert 0 <= finish.queue_wait_s <= finish.first_token_s
        assert finish.usage.completion_tokens > 1 and finish.decode_s > 0
