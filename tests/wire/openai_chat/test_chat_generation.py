"""POST /v1/chat/completions on the real SmolLM2: answers, streams, sampling controls."""

from __future__ import annotations

import pytest

from tests.wire.helpers import HELLO, read_stream

pytestmark = pytest.mark.anyio

PARIS = "The capital of France is Paris."  # SmolLM2's greedy answer (the engine's golden test)


async def test_non_streamed_answer_has_the_contract_shape(post_chat, served, smollm2_service):
    response = await post_chat(
        {"model": "anything", "messages": HELLO, "temperature": 0, "max_tokens": 12}
    )
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["id"].startswith("chatcmpl-") and len(body["id"]) > len("chatcmpl-")
    assert body["object"] == "chat.completion"
    assert isinstance(body["created"], int)
    assert body["model"] == "smollm2-135m-instruct"  # the served name, whatever was asked
    assert body["choices"] == [
        {"index": 0, "message": {"role": "assistant", "content": PARIS}, "finish_reason": "stop"}
    ]
    prompt_tokens = len(smollm2_service.encode_chat(HELLO))
    usage = body["usage"]
    assert usage["prompt_tokens"] == prompt_tokens
    assert usage["completion_tokens"] == 7
    assert usage["total_tokens"] == prompt_tokens + 7
    assert usage["prompt_tokens_details"] == {"cached_tokens": 0}
    assert usage["kv_used"] == prompt_tokens + 7
    assert usage["kv_cap"] == smollm2_service.context_window


async def test_streamed_answer_is_the_same_text_chunk_by_chunk(post_chat, served):
    body = {
        "messages": HELLO,
        "temperature": 0,
        "max_tokens": 12,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    response = await post_chat(body)
    assert response.status_code == 200
    assert response["Content-Type"] == "text/event-stream"
    assert response["Cache-Control"] == "no-cache"
    assert response["X-Accel-Buffering"] == "no"
    assert response["Access-Control-Allow-Origin"] == "*"
    events = await read_stream(response)

    first, *content, closing, usage, done = events
    assert first["choices"] == [{"index": 0, "delta": {"role": "assistant"}, "finish_reason": None}]
    assert len(content) >= 2  # one chunk per token, not one lump
    assert all(set(c["choices"][0]["delta"]) == {"content"} for c in content)
    assert "".join(c["choices"][0]["delta"]["content"] for c in content) == PARIS
    assert closing["choices"] == [{"index": 0, "delta": {}, "finish_reason": "stop"}]
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 7
    assert done == "[DONE]"
    chunks = [first, *content, closing, usage]
    assert {c["id"] for c in chunks} == {first["id"]}
    assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
    assert {c["model"] for c in chunks} == {"smollm2-135m-instruct"}


async def test_stream_without_include_usage_has_no_usage_chunk(post_chat, served):
    body = {"messages": HELLO, "temperature": 0, "max_tokens": 2, "stream": True}
    events = await read_stream(await post_chat(body))
    assert events[-1] == "[DONE]"
    assert events[-2]["choices"][0]["finish_reason"] == "length"
    assert all("usage" not in e for e in events[:-1])


async def test_greedy_decoding_is_deterministic(post_chat, served):
    body = {
        "messages": [{"role": "user", "content": "Tell me a story."}],
        "temperature": 0,
        "max_tokens": 6,
    }
    first = (await post_chat(body)).json()["choices"][0]["message"]["content"]
    second = (await post_chat(body)).json()["choices"][0]["message"]["content"]
    assert first and first == second


async def test_a_seed_makes_sampling_reproducible(post_chat, served):
    body = {
        "messages": [{"role": "user", "content": "Name a colour."}],
        "temperature": 1.0,
        "seed": 1234,
        "max_tokens": 6,
    }
    first = (await post_chat(body)).json()["choices"][0]["message"]["content"]
    second = (await post_chat(body)).json()["choices"][0]["message"]["content"]
    assert first == second


async def test_max_tokens_ends_the_answer_with_length(post_chat, served):
    body = {"messages": HELLO, "temperature": 0, "max_tokens": 3}
    body = (await post_chat(body)).json()
    assert body["choices"][0]["finish_reason"] == "length"
    assert body["usage"]["completion_tokens"] == 3
    assert PARIS.startswith(body["choices"][0]["message"]["content"])


async def test_max_completion_tokens_is_an_alias(post_chat, served):
    body = {"messages": HELLO, "temperature": 0, "max_completion_tokens": 2}
    assert (await post_chat(body)).json()["usage"]["completion_tokens"] == 2


async def test_a_stop_string_ends_the_answer_before_it(post_chat, served):
    body = {"messages": HELLO, "temperature": 0, "max_tokens": 12, "stop": ["zzz", "Paris"]}
    choice = (await post_chat(body)).json()["choices"][0]
    assert choice["message"]["content"] == "The capital of France is "
    assert choice["finish_reason"] == "stop"
