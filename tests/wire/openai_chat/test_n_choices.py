"""`n` above the served slots over HTTP: on an idle server every choice comes back (the
ones without a slot run as the request's slots free), with no `n_status`."""

from __future__ import annotations

import pytest

from engine.types import ModelConfig
from tests.wire.helpers import HELLO, read_stream

pytestmark = pytest.mark.anyio

NAME = "smollm2-135m-instruct"
REQUEST = {"messages": HELLO, "temperature": 1.0, "seed": 5, "max_tokens": 4, "n": 4}


@pytest.fixture
def two_slots(empty_runtime, smollm2_service):
    """The session's SmolLM2 weights served with two slots."""
    svc = smollm2_service.sibling(
        ModelConfig(name=NAME, path=smollm2_service.path, max_concurrent=2, prefix_cache=False)
    )
    empty_runtime.register(NAME, svc)
    yield svc
    svc.close()


async def test_n_above_the_served_slots_returns_every_choice(post_chat, two_slots):
    response = await post_chat(REQUEST)
    assert response.status_code == 200, response.content
    reply = response.json()
    assert [c["index"] for c in reply["choices"]] == [0, 1, 2, 3]
    assert "n_status" not in reply
    assert all(c["finish_reason"] in {"stop", "length"} for c in reply["choices"])
    # Choice i is the same decode as a single request with seed + i, slot or no slot.
    for i, choice in enumerate(reply["choices"]):
        single = (await post_chat({**REQUEST, "n": 1, "seed": 5 + i})).json()
        assert choice["message"] == single["choices"][0]["message"], i
    assert two_slots.scheduler.running == 0


async def test_n_above_the_served_slots_streams_every_choice_open_to_close(post_chat, two_slots):
    request = {**REQUEST, "stream": True, "stream_options": {"include_usage": True}}
    events = await read_stream(await post_chat(request))
    assert events[-1] == "[DONE]"
    usage = events[-2]["usage"]
    per_choice: dict[int, list[dict]] = {}
    for event in events[:-2]:
        assert "n_status" not in event
        (choice,) = event["choices"]
        per_choice.setdefault(choice["index"], []).append(choice)
    assert sorted(per_choice) == [0, 1, 2, 3]
    texts = {}
    for index, chunks in per_choice.items():
        assert chunks[0]["delta"] == {"role": "assistant"}  # each choice opens once
        assert chunks[-1]["delta"] == {} and chunks[-1]["finish_reason"] in {"stop", "length"}
        assert all(c["finish_reason"] is None for c in chunks[:-1])  # and closes once
        texts[index] = "".join(c["delta"].get("content", "") for c in chunks)
    non_streamed = (await post_chat({**request, "stream": False})).json()
    assert texts == {c["index"]: c["message"]["content"] for c in non_streamed["choices"]}
    assert usage == non_streamed["usage"]
