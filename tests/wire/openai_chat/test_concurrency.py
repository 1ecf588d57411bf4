"""Concurrency at the HTTP edge: the queue's 429 with Retry-After, a queued client that
hangs up, `n` > 1, the memory-pressure hook and its 503, and the drain's 503."""

from __future__ import annotations

import asyncio
import json
import threading

import pytest

from engine.types import ModelConfig, ServerBusy, ServerMemoryConstrained
from pantheon_platform import shutdown
from tests.wire.helpers import CHAT, HELLO, AsgiCall, read_stream

pytestmark = pytest.mark.anyio

NAME = "smollm2-135m-instruct"
LONG = [{"role": "user", "content": "Count from 1 to 1000, separated by commas."}]
PRESSURE = "/admin/debug/simulate-memory-pressure"


@pytest.fixture
def small(empty_runtime, smollm2_service):
    """The session's SmolLM2 weights with one slot and a queue of one."""
    svc = smollm2_service.sibling(
        ModelConfig(
            name=NAME,
            path=smollm2_service.path,
            max_concurrent=1,
            queue_depth=1,
            prefix_cache=False,
        )
    )
    empty_runtime.register(NAME, svc)
    yield svc
    svc.close()


@pytest.fixture
def eight_slots(empty_runtime, smollm2_service):
    svc = smollm2_service.sibling(
        ModelConfig(name=NAME, path=smollm2_service.path, max_concurrent=8, prefix_cache=False)
    )
    empty_runtime.register(NAME, svc)
    yield svc
    svc.close()


def body(**fields) -> bytes:
    return json.dumps({"temperature": 0, **fields}).encode()


def content_chunks(call: AsgiCall) -> int:
    return sum(b'"content"' in chunk for chunk in call.chunks)


async def wait_until(predicate, timeout: float = 30) -> None:
    async def poll():
        while not predicate():
            await asyncio.sleep(0.02)

    await asyncio.wait_for(poll(), timeout)


async def test_slots_and_queue_full_is_429_with_retry_after(asgi_app, small):
    running = AsgiCall(asgi_app, CHAT, body(messages=LONG, max_tokens=300, stream=True)).start()
    await running.wait_for(lambda c: content_chunks(c) >= 1, timeout=120)
    queued = AsgiCall(asgi_app, CHAT, body(messages=HELLO, max_tokens=2)).start()
    await wait_until(lambda: small.queued == 1)

    refused = AsgiCall(asgi_app, CHAT, body(messages=HELLO, max_tokens=2)).start()
    await asyncio.wait_for(refused.task, 10)
    assert refused.status == 429
    headers = {k.lower(): v for k, v in refused.headers.items()}
    retry_after = int(headers[b"retry-after"])
    assert 1 <= retry_after <= 30
    error = json.loads(b"".join(refused.chunks))["error"]
    assert error["type"] == "server_busy" and error["code"] is None

    running.hang_up.set()  # the slot frees; the queued request runs and answers
    await asyncio.wait_for(running.task, 10)
    await asyncio.wait_for(queued.task, 120)
    assert queued.status == 200
    assert json.loads(b"".join(queued.chunks))["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("stream", [False, True])
async def test_a_queued_client_that_hangs_up_frees_its_place(asgi_app, small, stream):
    running = AsgiCall(asgi_app, CHAT, body(messages=LONG, max_tokens=300, stream=True)).start()
    await running.wait_for(lambda c: content_chunks(c) >= 1, timeout=120)
    queued = AsgiCall(asgi_app, CHAT, body(messages=HELLO, max_tokens=2, stream=stream)).start()
    await wait_until(lambda: small.queued == 1)

    queued.hang_up.set()
    await asyncio.wait_for(queued.task, 10)
    assert queued.status is None  # nothing was sent to the departed client
    await wait_until(lambda: small.queued == 0, timeout=5)

    # Its place is free: the next request waits in the queue instead of a 429.
    nxt = AsgiCall(asgi_app, CHAT, body(messages=HELLO, max_tokens=2)).start()
    await wait_until(lambda: small.queued == 1)
    running.hang_up.set()
    await asyncio.wait_for(nxt.task, 120)
    assert nxt.status == 200


async def test_n_choices_non_streamed(post_chat, eight_slots, smollm2_service):
    request = {"messages": HELLO, "temperature": 1.0, "seed": 11, "max_tokens": 5, "n": 3}
    response = await post_chat(request)
    assert response.status_code == 200, response.content
    reply = response.json()
    assert [c["index"] for c in reply["choices"]] == [0, 1, 2]
    assert "n_status" not in reply
    # Choice i is the same decode as a single request with seed + i.
    for i, choice in enumerate(reply["choices"]):
        single = (await post_chat({**request, "n": 1, "seed": 11 + i})).json()
        assert choice["message"] == single["choices"][0]["message"]
    usage = reply["usage"]
    prompt_tokens = len(smollm2_service.encode_chat(HELLO))
    assert usage["prompt_tokens"] == prompt_tokens  # the prompt counts once
    assert usage["completion_tokens"] <= 15
    assert usage["total_tokens"] == prompt_tokens + usage["completion_tokens"]


async def test_n_above_eight_is_capped_and_says_so(post_chat, eight_slots):
    reply = (await post_chat({"messages": HELLO, "max_tokens": 1, "n": 12})).json()
    assert len(reply["choices"]) == 8 and reply["n_status"] == "capped_to_8"


async def test_n_above_the_served_slots_runs_the_choices_in_turn(post_chat, small):
    reply = (await post_chat({"messages": HELLO, "max_tokens": 2, "n": 3})).json()
    assert [c["index"] for c in reply["choices"]] == [0, 1, 2] and "n_status" not in reply


async def test_n_choices_streamed_are_told_apart_by_index(post_chat, eight_slots):
    request = {
        "messages": HELLO,
        "temperature": 1.0,
        "seed": 3,
        "max_tokens": 4,
        "n": 2,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    events = await read_stream(await post_chat(request))
    assert events[-1] == "[DONE]"
    usage = events[-2]["usage"]
    per_choice: dict[int, list[dict]] = {0: [], 1: []}
    for event in events[:-2]:
        (choice,) = event["choices"]
        per_choice[choice["index"]].append(choice)
    texts = {}
    for index, chunks in per_choice.items():
        assert chunks[0]["delta"] == {"role": "assistant"}  # each choice opens with its role
        assert chunks[-1]["delta"] == {} and chunks[-1]["finish_reason"] in {"stop", "length"}
        texts[index] = "".join(c["delta"].get("content", "") for c in chunks)
    non_streamed = (await post_chat({**request, "stream": False})).json()
    assert texts == {c["index"]: c["message"]["content"] for c in non_streamed["choices"]}
    assert usage == non_streamed["usage"]


async def test_the_pressure_hook_is_404_unless_debug_routes_are_on(post_chat, client, served):
    response = await client.post(
        PRESSURE, data={"level": "critical"}, content_type="application/json"
    )
    assert response.status_code == 404
    assert response.json()["error"]["type"] == "not_found"


async def test_simulated_memory_pressure_steps_the_served_numbers_down_and_back(
    client, post_chat, small, settings
):
    settings.PANTHEON_DEBUG_ROUTES = True

    async def pressure(level):
        response = await client.post(
            PRESSURE, data=json.dumps({"level": level}), content_type="application/json"
        )
        assert response.status_code == 200, response.content
        return response.json()

    async def listed():
        return (await client.get("/v1/models")).json()["data"][0]

    assert (await listed())["context_window"] == 8192
    moved = await pressure("critical")
    assert moved["memory_pressure"] == "critical" and moved["simulated"] is True
    assert (moved["context_window"], moved["context_window_configured"]) == (2048, 8192)
    assert (moved["max_concurrent"], moved["max_concurrent_configured"]) == (1, 1)
    row = await listed()
    assert (row["context_window"], row["max_concurrent"]) == (2048, 1)

    # A prompt that fits the configured window but not the clamped one: 503, transient.
    long_prompt = [{"role": "user", "content": "hello " * 3000}]
    response = await post_chat({"messages": long_prompt, "max_tokens": 1})
    assert response.status_code == 503
    assert response.json()["error"]["type"] == "server_memory_constrained"
    assert int(response["Retry-After"]) >= 1
    reply = (await post_chat({"messages": HELLO, "max_tokens": 1})).json()
    assert reply["usage"]["kv_cap"] == 2048  # usage reports the live window

    cleared = await pressure(None)
    assert cleared["simulated"] is False and cleared["context_window"] == 8192
    assert (await listed())["context_window"] == 8192
    bad = await client.post(
        PRESSURE, data=json.dumps({"level": 9}), content_type="application/json"
    )
    assert bad.status_code == 400


async def test_while_draining_new_completions_get_503_shutting_down(post_chat, served, monkeypatch):
    draining = threading.Event()
    draining.set()
    monkeypatch.setattr(shutdown, "_draining", draining)
    response = await post_chat({"messages": HELLO, "max_tokens": 1})
    assert response.status_code == 503
    assert response["Retry-After"] == "1"
    assert response.json()["error"]["type"] == "server_shutting_down"


@pytest.mark.parametrize(
    "exc,status,type_,retry_after",
    [
        (ServerBusy("busy", retry_after=7), 429, "server_busy", "7"),
        (ServerMemoryConstrained("tight", retry_after=3), 503, "server_memory_constrained", "3"),
    ],
)
async def test_engine_refusals_carry_retry_after(
    post_chat, served, monkeypatch, exc, status, type_, retry_after
):
    svc = next(iter(served.services().values()))

    async def refuse(request):
        raise exc
        yield  # an async generator, like the real one

    monkeypatch.setattr(svc, "generate", refuse)
    for stream in (False, True):
        response = await post_chat({"messages": HELLO, "stream": stream})
        assert response.status_code == status
        assert response["Retry-After"] == retry_after
        assert response.json()["error"]["type"] == type_
