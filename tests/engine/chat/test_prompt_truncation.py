"""truncation "auto" in the chat core's prompt building (engine/chat/prompt.py): the
oldest turns go whole, the system messages and the latest user turn stay, the prompt
fits the budget, and "disabled" keeps today's refusal."""

from __future__ import annotations

import pytest

from engine import ContextOverBudget, SamplingParams, Turn
from engine.chat.core import prepare_turn
from engine.chat.prompt import droppable_turns

SYSTEM = {"role": "system", "content": "You are terse."}


def history(turns: int, words: int = 60) -> list[dict]:
    out = [SYSTEM]
    for i in range(turns):
        out.append({"role": "user", "content": f"question {i}: " + "blah " * words})
        out.append({"role": "assistant", "content": f"answer {i}: " + "meh " * words})
    out.append({"role": "user", "content": "And the last question?"})
    return out


def test_turns_start_at_user_messages_and_keep_tool_results():
    call = {"role": "assistant", "content": "", "tool_calls": [{"id": "c1"}]}
    result = {"role": "tool", "tool_call_id": "c1", "content": "4"}
    messages = [
        SYSTEM,
        {"role": "assistant", "content": "hello"},
        {"role": "user", "content": "a"},
        call,
        result,
        {"role": "assistant", "content": "it is 4"},
        {"role": "user", "content": "b"},
        call,
        result,
    ]
    head, turns, tail = droppable_turns(messages)
    assert head == [SYSTEM]
    assert turns == [[messages[1]], messages[2:6]]
    assert tail == messages[6:]  # the latest user message and what answers it so far


def test_without_a_user_message_the_last_message_stays():
    said = [{"role": "assistant", "content": str(i)} for i in range(3)]
    head, turns, tail = droppable_turns([SYSTEM, *said])
    assert (head, turns, tail) == ([SYSTEM], [said[:2]], said[2:])


def test_nothing_droppable_without_an_earlier_turn():
    head, turns, tail = droppable_turns([SYSTEM, {"role": "user", "content": "x"}])
    assert (head, turns, tail) == ([SYSTEM], [], [{"role": "user", "content": "x"}])


def test_the_fewest_oldest_turns_are_dropped_to_fit(smollm2_service):
    prompts = smollm2_service.prompts
    messages = history(12)
    full = prompts.encode_chat(messages)
    budget = len(full) // 2
    ids, _, dropped = prompts.prepare_chat_fitting(messages, budget)
    assert 0 < dropped < 24 and dropped % 2 == 0 and len(ids) <= budget
    text = prompts.tokenizer.decode(ids)
    assert "You are terse." in text and "And the last question?" in text
    assert "question 0:" not in text and "question 11:" in text
    # One turn more would not have fitted: the fewest were dropped.
    kept_one_more = [SYSTEM, *messages[1 + dropped - 2 :]]
    assert len(prompts.encode_chat(kept_one_more)) > budget


def test_a_conversation_that_fits_is_untouched(smollm2_service):
    prompts = smollm2_service.prompts
    messages = history(2)
    ids, _, dropped = prompts.prepare_chat_fitting(messages, 10_000)
    assert dropped == 0 and ids == prompts.encode_chat(messages)


def overflowing_turn(truncation: str) -> Turn:
    # ~12k tokens against SmolLM2's 8192-token window
    return Turn(
        messages=tuple(history(40, words=150)),
        sampling=SamplingParams(max_tokens=64),
        truncation=truncation,
    )


def test_auto_fits_the_window_and_says_how_many_went(smollm2_service):
    prepared = prepare_turn(smollm2_service, overflowing_turn("auto"))
    window = smollm2_service.prompts.context_window
    assert prepared.prompt_tokens <= window - 64
    assert prepared.request.truncated_messages > 0


@pytest.mark.anyio
async def test_disabled_keeps_the_refusal(smollm2_service):
    from engine.chat.core import run_turn

    prepared = prepare_turn(smollm2_service, overflowing_turn("disabled"))
    assert prepared.request.truncated_messages == 0
    with pytest.raises(ContextOverBudget):
        events = run_turn(smollm2_service, prepared)
        await events.__anext__()
