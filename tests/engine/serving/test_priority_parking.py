"""Priority classes on the real SmolLM2 through the production engine loop: with batch
requests in every slot, an interactive one is admitted at once (a batch sequence parks:
its KV copied out, later back) and finishes while they still run; every batch
sequence's tokens are exactly those it produces alone."""

from __future__ import annotations

import asyncio
import time
from dataclasses import replace

import pytest

from engine.types import FinishEvent, GenerationRequest, SamplingParams, TokenEvent

BATCH_TOKENS = SamplingParams(temperature=0, max_tokens=24)
QUESTIONS = [
    "What is the capital of France?",
    "Name three colours.",
    "Count to five.",
    "What is two plus two?",
    "Say hello in Spanish.",
    "What is the largest planet?",
    "Name a fruit.",
    "Why is the sky blue?",
]


@pytest.fixture(autouse=True)
def idle_model(idle_smollm2):
    """Each test starts on an idle model (tests/conftest.py wait_idle)."""


async def collect(svc, request: GenerationRequest, started: asyncio.Event | None = None):
    ids, finish = [], None
    async for event in svc.generate(request):
        if isinstance(event, TokenEvent):
            ids.extend(event.token_ids)
            if started is not None:
                started.set()
        elif isinstance(event, FinishEvent):
            finish = event
    return ids, finish, time.monotonic()


def prompt(svc, text: str) -> tuple[int, ...]:
    return tuple(svc.encode_chat([{"role": "user", "content": text}]))


def test_an_interactive_request_takes_a_batch_slot_and_batch_tokens_stay_exact(
    smollm2_service,
):
    svc = smollm2_service
    slots = svc.max_concurrent
    batch = [
        GenerationRequest(
            f"b{i}",
            prompt(svc, QUESTIONS[i % len(QUESTIONS)] + " " * (i // 8)),
            BATCH_TOKENS,
            priority="batch",
        )
        for i in range(slots)
    ]

    async def alone():
        return [(await collect(svc, replace(r, priority="interactive")))[0] for r in batch]

    solo = asyncio.run(alone())
    parks_before = svc.scheduler.lane.parks_total

    async def together():
        started = [asyncio.Event() for _ in batch]
        tasks = [
            asyncio.create_task(collect(svc, r, e)) for r, e in zip(batch, started, strict=True)
        ]
        await asyncio.gather(*(e.wait() for e in started))  # every slot decodes batch work
        live = GenerationRequest(
            "live", prompt(svc, "Hi"), SamplingParams(temperature=0, max_tokens=3)
        )
        interactive = await collect(svc, live)
        return interactive, await asyncio.gather(*tasks)

    (live_ids, live_finish, live_done), results = asyncio.run(together())
    assert live_ids and live_finish is not None
    assert svc.scheduler.lane.parks_total > parks_before
    # It did not wait for a batch sequence to end: at least one was still running.
    assert any(done > live_done for _, _, done in results)
    assert [ids for ids, _, _ in results] == solo
