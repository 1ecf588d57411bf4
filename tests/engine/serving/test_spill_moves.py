"""A kept slot spilled to host memory by moving its pages (KVCache.take) when admission
overwrites it: the prompt that overwrites it still resumes from the positions it shares
with what the slot held, and the spilled prompt, loaded back later, answers as it did
cold. One slot, so that every new prompt displaces the last one."""

from __future__ import annotations

import dataclasses

import pytest

from engine.serving.slot_cache import common_prefix
from engine.types import GenerationRequest, SamplingParams
from kernels import page_moves
from tests.support import generate_text

GREEDY = SamplingParams(temperature=0.0, max_tokens=8)


@pytest.fixture(scope="module")
def one_slot(smollm2_service):
    config = dataclasses.replace(
        smollm2_service.config, name="one-slot", prefix_cache=True, max_sessions=1, max_concurrent=1
    )
    svc = smollm2_service.sibling(config)
    yield svc
    svc.close()


def run(svc, prompt):
    return generate_text(svc, GenerationRequest("spill", tuple(prompt), GREEDY))


def test_a_displaced_long_prompt_moves_out_and_both_answer_as_cold(one_slot, monkeypatch):
    svc = one_slot
    moves = []
    move = page_moves.move
    monkeypatch.setattr(page_moves, "move", lambda *args: moves.append(args) or move(*args))
    history = "The keeper logged every ship that passed the light. " * 40
    a = svc.encode_chat([{"role": "user", "content": history + "Who kept the light?"}])
    b = svc.encode_chat([{"role": "user", "content": history + "What did he log?"}])
    shared = common_prefix(tuple(a), tuple(b))
    assert shared > 300 and len(a) - shared >= 3
    svc.clear_prefix_cache().result(timeout=30)
    cold_b, _ = run(svc, b)
    svc.clear_prefix_cache().result(timeout=30)
    cold_a, first = run(svc, a)
    assert first.usage.cached_tokens == 0

    # b takes a's slot (the only one): a goes to host memory, its shared positions stay
    # in the slot for b, which resumes after them.
    warm_b, finish = run(svc, b)
    assert finish.usage.cached_tokens == shared
    assert warm_b == cold_b
    assert svc.slot_contents.spilled_bytes() > 0

    # a again: b's KV spills, a's comes back from host memory.
    warm_a, finish = run(svc, a)
    assert finish.usage.cached_tokens == len(a) - 1
    assert warm_a == cold_a

    # An unrelated prompt displaces a: nothing of it is read in place, so its pages move
    # (where the OS allows), and a comes back from them as it was.
    run(svc, svc.encode_chat([{"role": "user", "content": "Hi."}]))
    assert moves or not page_moves.available()
    warm_a, finish = run(svc, a)
    assert finish.usage.cached_tokens == len(a) - 1
    assert warm_a == cold_a
