"""A client that hangs up mid-stream stops its generation and frees its slot.

Driven through Django's real ASGI handler, which cancels the response when the server
reports http.disconnect (as Daphne does when the socket closes).
"""

from __future__ import annotations

import asyncio
import json
import time

import pytest

from tests.wire.helpers import CHAT, AsgiCall

pytestmark = pytest.mark.anyio

LONG = [{"role": "user", "content": "Count from 1 to 1000, separated by commas."}]


@pytest.fixture
def closed_streams(smollm2_service, monkeypatch) -> list[str]:
    """Records each engine stream the view closes, by request id (spy on the real one)."""
    closed: list[str] = []
    real_generate = smollm2_service.generate

    async def generate(request):
        stream = real_generate(request)
        try:
            async for event in stream:
                yield event
        finally:
            await stream.aclose()
            closed.append(request.request_id)

    monkeypatch.setattr(smollm2_service, "generate", generate)
    return closed


def content_chunks(call: AsgiCall) -> int:
    return sum(b'"content"' in chunk for chunk in call.chunks)


def body(**fields) -> bytes:
    return json.dumps({"temperature": 0, **fields}).encode()


async def answer_when_free(asgi_app, timeout: float = 15) -> AsgiCall:
    """A one-token request, retried while the engine reports busy (kept for small limits:
    an aborted generation frees its slot at the engine's next step)."""
    deadline = time.monotonic() + timeout
    while True:
        call = AsgiCall(asgi_app, CHAT, body(messages=[{"content": "Hi"}], max_tokens=1)).start()
        await asyncio.wait_for(call.task, 120)
        if call.status != 429 or time.monotonic() > deadline:
            return call
        await asyncio.sleep(0.2)


async def test_hanging_up_mid_stream_aborts_the_generation(asgi_app, served, closed_streams):
    streaming = AsgiCall(asgi_app, CHAT, body(messages=LONG, max_tokens=400, stream=True)).start()
    await streaming.wait_for(lambda c: content_chunks(c) >= 2, timeout=120)
    assert streaming.status == 200
    assert closed_streams == []

    # The batch scheduler serves a second request beside the open stream.
    beside = AsgiCall(asgi_app, CHAT, body(messages=LONG, max_tokens=2)).start()
    await asyncio.wait_for(beside.task, 60)
    assert beside.status == 200
    assert json.loads(b"".join(beside.chunks))["usage"]["completion_tokens"] == 2
    assert len(closed_streams) == 1  # that one; the stream is still open

    streaming.hang_up.set()
    await asyncio.wait_for(streaming.task, 10)  # the handler returns; nothing hangs
    assert len(closed_streams) == 2
    assert not streaming.chunks[-1].endswith(b"data: [DONE]\n\n")

    # Without the abort the slot would stay taken for ~400 tokens; it frees within a step.
    after = await answer_when_free(asgi_app)
    assert after.status == 200, b"".join(after.chunks)


async def test_hanging_up_on_a_stalled_stream_aborts_the_generation(
    asgi_app, served, closed_streams
):
    # The client stops reading, then leaves: the handler is cancelled inside send(), with
    # the event generator parked at a yield rather than waiting on the engine.
    assert (await answer_when_free(asgi_app)).status == 200
    closed_streams.clear()
    streaming = AsgiCall(asgi_app, CHAT, body(messages=LONG, max_tokens=400, stream=True))
    streaming.start()
    await streaming.wait_for(lambda c: content_chunks(c) >= 1, timeout=120)
    streaming.stall = True
    await streaming.wait_for(lambda c: content_chunks(c) >= 2, timeout=60)
    streaming.hang_up.set()
    await asyncio.wait_for(streaming.task, 10)
    assert len(closed_streams) == 1
    assert (await answer_when_free(asgi_app)).status == 200


async def test_hanging_up_on_a_non_streamed_request_aborts_it(
    asgi_app, served, closed_streams, smollm2_service
):
    assert (await answer_when_free(asgi_app)).status == 200
    closed_streams.clear()
    # Long enough to still be running when we hang up, however fast the kernels: the
    # turn's end tokens are banned, so it runs to max_tokens.
    never_end = {str(i): -100 for i in smollm2_service.tokenizer.end_of_turn_ids}
    request = body(messages=LONG, max_tokens=3000, logit_bias=never_end)
    waiting = AsgiCall(asgi_app, CHAT, request).start()
    # Give the engine time to start generating, then hang up before the answer exists.
    await asyncio.sleep(1.5)
    assert not waiting.task.done()
    waiting.hang_up.set()
    await asyncio.wait_for(waiting.task, 10)
    assert len(closed_streams) == 1
    assert waiting.status is None  # nothing was sent to the departed client
    assert (await answer_when_free(asgi_app)).status == 200
