"""The prefix cache through POST /v1/chat/completions on the real SmolLM2: later turns of
a session prefill only their new tokens, say so in `cached_tokens`, and answer exactly
as a cold run of the same conversation would."""

from __future__ import annotations

import dataclasses

import pytest

from tests.wire.helpers import read_stream

pytestmark = pytest.mark.anyio

SYSTEM = {"role": "system", "content": "You are a concise assistant."}
TURN_1 = [SYSTEM, {"role": "user", "content": "What is the capital of France?"}]
FOLLOW_UP = {"role": "user", "content": "And of Germany?"}


def body(messages, **extra) -> dict:
    return {"messages": messages, "temperature": 0, "max_tokens": 48, **extra}


async def chat(post_chat, messages, **extra) -> dict:
    response = await post_chat(body(messages, **extra))
    assert response.status_code == 200, response.content
    return response.json()


def answer(reply: dict) -> str:
    return reply["choices"][0]["message"]["content"]


def cached(reply: dict) -> int:
    return reply["usage"]["prompt_tokens_details"]["cached_tokens"]


async def test_turn_two_reuses_turn_one_prompt_and_completion_and_answers_as_cold(
    post_chat, served
):
    first = await chat(post_chat, TURN_1, session_id="multi-turn")
    assert cached(first) == 0
    assert first["choices"][0]["finish_reason"] == "stop"
    turn_2 = [*TURN_1, {"role": "assistant", "content": answer(first)}, FOLLOW_UP]
    second = await chat(post_chat, turn_2, session_id="multi-turn")
    # Every token of turn 1 (its prompt and its answer) is reused: the chat template
    # re-renders the assistant turn to exactly the tokens the model produced.
    used = first["usage"]
    assert cached(second) == used["prompt_tokens"] + used["completion_tokens"]
    cold = await chat(post_chat, turn_2)
    assert cached(cold) == 0
    assert answer(second) == answer(cold)
    assert second["usage"]["prompt_tokens"] == cold["usage"]["prompt_tokens"]
    # A third turn goes on from the second.
    turn_3 = [*turn_2, {"role": "assistant", "content": answer(second)}, FOLLOW_UP]
    third = await chat(post_chat, turn_3, session_id="multi-turn")
    used = second["usage"]
    assert cached(third) == used["prompt_tokens"] + used["completion_tokens"]
    assert answer(third) == answer(await chat(post_chat, turn_3))


async def test_after_a_length_stop_the_last_sampled_token_is_computed_next_turn(post_chat, served):
    """A turn cut by max_tokens never fed its last token back: its KV is not held."""
    first = await chat(post_chat, TURN_1, session_id="cut", max_tokens=5)
    assert first["choices"][0]["finish_reason"] == "length"
    turn_2 = [*TURN_1, {"role": "assistant", "content": answer(first)}, FOLLOW_UP]
    second = await chat(post_chat, turn_2, session_id="cut")
    used = first["usage"]
    assert cached(second) == used["prompt_tokens"] + used["completion_tokens"] - 1
    assert answer(second) == answer(await chat(post_chat, turn_2))


async def test_smollm2_template_rerenders_a_generated_turn_to_the_same_tokens(
    post_chat, served, smollm2_service
):
    """The proof behind `cached_tokens` == prompt + completion: rendering the answer back
    gives turn 1's prompt, then the generated ids, then the end of turn."""
    first = await chat(post_chat, TURN_1, max_tokens=40)
    prompt_1 = smollm2_service.encode_chat(TURN_1)
    generated = smollm2_service.tokenizer.encode(answer(first))
    assert len(generated) == first["usage"]["completion_tokens"]
    history = smollm2_service.encode_chat(
        [*TURN_1, {"role": "assistant", "content": answer(first)}, FOLLOW_UP]
    )
    assert history[: len(prompt_1) + len(generated)] == prompt_1 + generated


async def test_the_session_id_comes_from_any_of_its_names(post_chat, client, served):
    first = await chat(post_chat, TURN_1, prompt_cache_key="key-1")
    turn_2 = [*TURN_1, {"role": "assistant", "content": answer(first)}, FOLLOW_UP]
    assert cached(await chat(post_chat, turn_2, promptCacheKey="key-1")) > 0
    # The header, when the body names none.
    response = await client.post(
        "/v1/chat/completions",
        data=body(TURN_1),
        content_type="application/json",
        headers={"X-Session-Id": "key-2"},
    )
    assert response.status_code == 200
    assert cached(await chat(post_chat, turn_2, session_id="key-2")) > 0
    # A body key wins over the header: a new id is a cold turn.
    response = await client.post(
        "/v1/chat/completions",
        data=body(turn_2, session_id="key-3"),
        content_type="application/json",
        headers={"X-Session-Id": "key-2"},
    )
    assert cached(response.json()) == 0


async def test_a_streamed_turn_resumes_and_reports_cached_tokens(post_chat, served):
    first = await chat(post_chat, TURN_1, session_id="streamed")
    turn_2 = [*TURN_1, {"role": "assistant", "content": answer(first)}, FOLLOW_UP]
    response = await post_chat(
        body(turn_2, session_id="streamed", stream=True, stream_options={"include_usage": True})
    )
    events = await read_stream(response)
    usage = events[-2]["usage"]
    used = first["usage"]
    assert usage["prompt_tokens_details"]["cached_tokens"] == (
        used["prompt_tokens"] + used["completion_tokens"]
    )
    text = "".join(e["choices"][0]["delta"].get("content", "") for e in events[1:-3])
    assert text == answer(await chat(post_chat, turn_2))


async def test_two_conversations_under_one_id_each_keep_their_cache(post_chat, served):
    title = [{"role": "user", "content": "Give this chat a three-word title."}]
    main = await chat(post_chat, TURN_1, session_id="two-convs")
    await chat(post_chat, title, session_id="two-convs", max_tokens=6)
    turn_2 = [*TURN_1, {"role": "assistant", "content": answer(main)}, FOLLOW_UP]
    second = await chat(post_chat, turn_2, session_id="two-convs")
    used = main["usage"]
    assert cached(second) == used["prompt_tokens"] + used["completion_tokens"]
    assert "session_conflict" not in second["usage"]


async def test_conversations_displacing_each_other_report_a_conflict(post_chat, served):
    from engine.serving.sessions import MAX_CONVERSATIONS

    replies = []
    assert MAX_CONVERSATIONS == 4
    for i in range(MAX_CONVERSATIONS + 1):
        # Different from their first tokens on: nothing for one to resume from another.
        topic = ["Cats", "Rivers", "Planets", "Music", "Bread"][i]
        messages = [
            {"role": "system", "content": f"{topic} are the only subject you discuss."},
            {"role": "user", "content": f"Tell me about {topic.lower()}."},
        ]
        replies.append(await chat(post_chat, messages, session_id="crowded", max_tokens=2))
    assert all("session_conflict" not in r["usage"] for r in replies[:-1])
    assert replies[-1]["usage"]["session_conflict"] is True


async def test_a_new_session_past_max_sessions_is_429_with_retry_after(
    post_chat, served, smollm2_service
):
    one = smollm2_service.sibling(
        dataclasses.replace(smollm2_service.config, name="one-session", max_sessions=1)
    )
    served.register("one-session", one)
    try:
        assert (
            await post_chat(body(TURN_1, model="one-session", session_id="a"))
        ).status_code == 200
        response = await post_chat(body(TURN_1, model="one-session", session_id="b"))
        assert response.status_code == 429
        assert response["Retry-After"] == "30"
        error = response.json()["error"]
        assert error["type"] == "model_at_session_capacity"
        assert "re-prefill" in error["message"]
        # The held id and requests without a session are still served.
        assert (
            await post_chat(body(TURN_1, model="one-session", session_id="a"))
        ).status_code == 200
        assert (await post_chat(body(TURN_1, model="one-session"))).status_code == 200
    finally:
        served.unregister("one-session")
        one.close()


async def test_n_choices_resume_together_and_only_the_first_is_kept(post_chat, served):
    first = await chat(post_chat, TURN_1, session_id="n-choices")
    turn_2 = [*TURN_1, {"role": "assistant", "content": answer(first)}, FOLLOW_UP]
    reply = await chat(post_chat, turn_2, session_id="n-choices", n=2, seed=3, temperature=0.8)
    assert len(reply["choices"]) == 2
    assert cached(reply) > 0
    kept = reply["choices"][0]["message"]["content"]
    turn_3 = [*turn_2, {"role": "assistant", "content": kept}, FOLLOW_UP]
    assert (
        cached(await chat(post_chat, turn_3, session_id="n-choices"))
        >= (reply["usage"]["prompt_tokens"])
    )
