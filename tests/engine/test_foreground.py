"""Foreground work (a prompt's prefill) and the bulk work that steps aside for it
(engine/foreground.py): a huge text's tokenization waits between its pieces while a
prefill runs, never longer than its bound."""

from __future__ import annotations

import threading
import time

from engine import foreground
from engine.foreground import Foreground
from engine.text import tokenizer as tokenizer_module


def test_quiet_is_immediate_and_a_running_pass_is_waited_for():
    fg = Foreground()
    started = time.monotonic()
    assert fg.wait_quiet(1.0) and time.monotonic() - started < 0.05
    ended = threading.Event()

    def pass_of(seconds: float) -> None:
        with fg.running():
            time.sleep(seconds)
        ended.set()

    with fg.running():
        threading.Thread(target=pass_of, args=(0.05,)).start()
    time.sleep(0.01)
    assert fg.busy()
    assert fg.wait_quiet(2.0) and ended.is_set() and not fg.busy()


def test_the_wait_is_bounded():
    fg = Foreground()
    with fg.running():
        started = time.monotonic()
        assert not fg.wait_quiet(0.05)
        assert 0.04 < time.monotonic() - started < 1.0


def test_a_huge_texts_pieces_wait_for_a_running_prefill(smollm2_tokenizer, monkeypatch):
    monkeypatch.setattr(tokenizer_module, "PIECE_YIELD_S", 0.02)
    fg = Foreground()
    monkeypatch.setattr(tokenizer_module, "FOREGROUND", fg)
    waits = []
    wait_quiet = fg.wait_quiet
    monkeypatch.setattr(fg, "wait_quiet", lambda s: waits.append(fg.busy()) or wait_quiet(s))
    text = "lorem ipsum dolor sit amet " * 20_000  # ~540 KB: 8 pieces
    quiet_ids = smollm2_tokenizer.encode(text)
    assert len(waits) >= 8 and not any(waits)
    waits.clear()
    with fg.running():  # a prefill that outlasts the tokenization: every piece waited
        started = time.monotonic()
        assert smollm2_tokenizer.encode(text) == quiet_ids
        took = time.monotonic() - started
    assert len(waits) >= 8 and all(waits) and took >= 0.02 * len(waits)


def test_the_engine_shares_one_foreground_with_the_tokenizer():
    assert tokenizer_module.FOREGROUND is foreground.FOREGROUND


def test_the_engine_marks_its_prefill_passes_and_not_its_decode_steps(smollm2_service, monkeypatch):
    import asyncio

    from engine.types import GenerationRequest, SamplingParams

    runner = smollm2_service.engine_loop.runner
    seen: list[tuple[bool, bool]] = []  # (the pass prefills, foreground busy)
    run = runner.run

    def spy(batch, *args):
        seen.append((bool(batch.prefill), foreground.FOREGROUND.busy()))
        return run(batch, *args)

    monkeypatch.setattr(runner, "run", spy)
    prompt = tuple(smollm2_service.encode_chat([{"role": "user", "content": "Count to ten."}]))
    request = GenerationRequest("fg", prompt, SamplingParams(temperature=0, max_tokens=4))

    async def drain():
        async for _ in smollm2_service.generate(request):
            pass

    asyncio.run(drain())
    assert any(prefill for prefill, _ in seen) and any(not prefill for prefill, _ in seen)
    assert all(busy == prefill for prefill, busy in seen)
    assert not foreground.FOREGROUND.busy()
