"""A session turn that lands in the slot its previous turn parked from resumes without
copying the parked prefix back (the slot still holds it); any other use of the slot in
between means the copy, and both give the same tokens."""

from __future__ import annotations

import asyncio

import pytest

from engine.types import FinishEvent, GenerationRequest, SamplingParams
from tests.support import generate_text

GREEDY = SamplingParams(temperature=0.0, max_tokens=8)


@pytest.fixture
def svc(clean_smollm2):
    return clean_smollm2


@pytest.fixture
def loads(svc, monkeypatch):
    """The KV copies into slots, counted."""
    calls = []
    real = svc.kv.load

    def counted(slot, k, v, n):
        calls.append((slot, n))
        return real(slot, k, v, n)

    monkeypatch.setattr(svc.kv, "load", counted)
    return calls


def run(svc, messages, session_id=None) -> tuple[str, FinishEvent]:
    ids = svc.encode_chat(messages)
    request = GenerationRequest("res", tuple(ids), GREEDY, session_id=session_id)
    return generate_text(svc, request)


def conversation(svc, session_id, between=None) -> tuple[str, FinishEvent]:
    first = [{"role": "user", "content": "Name three colours of the rainbow."}]
    answer, _ = run(svc, first, session_id)
    if between is not None:
        between()
    follow = [*first, {"role": "assistant", "content": answer}]
    follow.append({"role": "user", "content": "And two more?"})
    return run(svc, follow, session_id)


def test_the_next_turn_resumes_in_the_slot_it_parked_from(svc, loads):
    text, finish = conversation(svc, "resident-a")
    assert finish.usage.cached_tokens > 0  # it resumed from the parked prefix
    assert loads == []  # without copying it back: the slot still held it


def every_slot_busy(svc) -> None:
    """As many requests at once as there are slots: the resident one is used too (a
    single request would get a slot that holds nothing)."""

    async def go():
        await asyncio.gather(
            *(
                asyncio.to_thread(run, svc, [{"role": "user", "content": f"Count to {i}."}])
                for i in range(svc.max_concurrent)
            )
        )

    asyncio.run(go())


def test_a_slot_used_in_between_is_copied_back_with_the_same_result(svc, loads):
    resident, _ = conversation(svc, "resident-b")
    assert loads == []
    copied, finish = conversation(svc, "resident-c", between=lambda: every_slot_busy(svc))
    assert finish.usage.cached_tokens > 0
    assert len(loads) == 1  # the slot was reused in between: the prefix was copied back
    assert copied == resident
