"""The decoding surface through POST /v1/chat/completions on the real SmolLM2: seeds,
logit_bias, logprobs, penalties, response_format enforced by a grammar, reasoning."""

from __future__ import annotations

import json
import math

import jsonschema
import pytest

from tests.wire.helpers import HELLO, read_stream

pytestmark = pytest.mark.anyio

PARIS = "The capital of France is Paris."
STORY = [{"role": "user", "content": "Write one sentence about a cat."}]


async def chat(post_chat, **body) -> dict:
    response = await post_chat({"messages": HELLO, "max_tokens": 12, **body})
    assert response.status_code == 200, response.content
    return response.json()


def text(reply: dict, i: int = 0) -> str:
    return reply["choices"][i]["message"]["content"]


# --- sampling ---------------------------------------------------------------------------


async def test_the_same_seed_gives_the_same_text_and_another_seed_differs(post_chat, served):
    a = await chat(post_chat, messages=STORY, temperature=1.0, seed=11, max_tokens=24)
    b = await chat(post_chat, messages=STORY, temperature=1.0, seed=11, max_tokens=24)
    c = await chat(post_chat, messages=STORY, temperature=1.0, seed=12, max_tokens=24)
    assert text(a) == text(b)
    assert text(a) != text(c)


async def test_logit_bias_removes_and_forces_tokens(post_chat, served, smollm2_service):
    tok = smollm2_service.tokenizer
    paris = tok.encode(" Paris")
    assert len(paris) == 1
    plain = await chat(post_chat, temperature=0)
    assert text(plain) == PARIS
    banned = await chat(post_chat, temperature=0, logit_bias={str(paris[0]): -100})
    assert "Paris" not in text(banned)
    forced_id = tok.encode(" banana")[0]
    forced = await chat(post_chat, temperature=0, max_tokens=3, logit_bias={str(forced_id): 100})
    assert text(forced) == tok.decode([forced_id] * 3)


async def test_ignore_eos_never_draws_an_end_of_turn_token(post_chat, served, smollm2_service):
    """llama.cpp's extension: the answer that ends after PARIS runs on to max_tokens; even a
    +100 bias on the end tokens does not bring them back."""
    plain = await chat(post_chat, temperature=0)
    assert text(plain) == PARIS and plain["choices"][0]["finish_reason"] == "stop"
    ends = sorted(smollm2_service.tokenizer.end_of_turn_ids)
    ending = {str(i): 100 for i in ends}
    assert text(await chat(post_chat, temperature=0, logit_bias=ending)) == ""
    running = await chat(post_chat, temperature=0, ignore_eos=True, logit_bias=ending)
    assert running["choices"][0]["finish_reason"] == "length"
    assert running["usage"]["completion_tokens"] == 12
    assert text(running).startswith(PARIS) and len(text(running)) > len(PARIS)


async def test_bad_logit_bias_entries_are_skipped_and_bias_clamped(post_chat, served):
    reply = await chat(
        post_chat, temperature=0, logit_bias={"not-a-token": 5, "12": "x", "999999999": 10}
    )
    assert text(reply) == PARIS


async def test_penalties_are_clamped_and_change_the_answer(post_chat, served):
    base = await chat(post_chat, messages=STORY, temperature=0, max_tokens=30)
    penalised = await chat(
        post_chat, messages=STORY, temperature=0, max_tokens=30, frequency_penalty=50
    )
    clamped = await chat(
        post_chat, messages=STORY, temperature=0, max_tokens=30, frequency_penalty=2
    )
    assert text(penalised) == text(clamped)  # 50 is clamped to 2
    assert text(penalised) != text(base)


async def test_top_logprobs_five_alternatives_first_is_the_greedy_choice(post_chat, served):
    reply = await chat(post_chat, temperature=0, logprobs=True, top_logprobs=5)
    content = reply["choices"][0]["logprobs"]["content"]
    assert "".join(e["token"] for e in content) == PARIS
    for entry in content:
        top = entry["top_logprobs"]
        assert len(top) == 5
        assert top[0]["token"] == entry["token"]
        assert top[0]["logprob"] == pytest.approx(entry["logprob"])
        assert sum(math.exp(t["logprob"]) for t in top) <= 1 + 1e-6
        assert bytes(entry["bytes"]).decode() == entry["token"]


async def test_top_logprobs_is_clamped_to_twenty_and_implies_logprobs(post_chat, served):
    reply = await chat(post_chat, temperature=0, top_logprobs=50, max_tokens=2)
    content = reply["choices"][0]["logprobs"]["content"]
    assert [len(e["top_logprobs"]) for e in content] == [20, 20]


async def test_streamed_logprobs_ride_the_chunk_with_their_token(post_chat, served):
    response = await post_chat(
        {"messages": HELLO, "temperature": 0, "max_tokens": 12, "stream": True, "logprobs": True}
    )
    events = await read_stream(response)
    tokens = []
    for e in events[1:-2]:
        choice = e["choices"][0]
        tokens += [x["token"] for x in choice.get("logprobs", {}).get("content", [])]
    assert "".join(tokens) == PARIS


async def test_a_stuck_decode_ends_with_repetition_loop(post_chat, served, smollm2_service):
    dot = smollm2_service.tokenizer.encode(".")[0]
    reply = await chat(post_chat, temperature=0, max_tokens=300, logit_bias={str(dot): 100})
    assert reply["choices"][0]["finish_reason"] == "repetition_loop"
    assert reply["usage"]["completion_tokens"] < 300


# --- response_format --------------------------------------------------------------------

PET_SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 12},
        "kind": {"enum": ["cat", "dog", "bird"]},
        "age": {"type": "integer", "minimum": 0, "maximum": 30},
        "owner": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 12},
                "verified": {"type": "boolean"},
            },
            "required": ["city", "verified"],
            "additionalProperties": False,
        },
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 8}, "maxItems": 3},
    },
    "required": ["name", "kind", "age", "owner", "tags"],
    "additionalProperties": False,
}
PET_FORMAT = {"type": "json_schema", "json_schema": {"name": "pet", "schema": PET_SCHEMA}}
PET_PROMPT = [{"role": "user", "content": "Describe a pet as JSON."}]


async def test_json_schema_sampled_completions_all_validate(post_chat, served):
    """20 completions at temperature 1 (five requests of n=4): every one parses and
    validates against the nested schema, and says the format was applied."""
    replies = [
        await chat(
            post_chat,
            messages=PET_PROMPT,
            temperature=1.0,
            seed=seed,
            n=4,
            max_tokens=200,
            response_format=PET_FORMAT,
        )
        for seed in range(0, 50, 10)
    ]
    values = []
    for reply in replies:
        assert reply["response_format_status"] == "applied"
        for choice in reply["choices"]:
            value = json.loads(choice["message"]["content"])
            jsonschema.validate(value, PET_SCHEMA)
            values.append(value)
    assert len(values) == 20
    assert len({json.dumps(v, sort_keys=True) for v in values}) > 1  # really sampled


async def test_json_schema_streamed_completions_all_validate(post_chat, served):
    for seed in range(100, 150, 10):
        response = await post_chat(
            {
                "messages": PET_PROMPT,
                "temperature": 1.0,
                "seed": seed,
                "n": 4,
                "max_tokens": 200,
                "stream": True,
                "response_format": PET_FORMAT,
            }
        )
        events = await read_stream(response)
        parts: dict[int, list[str]] = {}
        statuses = []
        for e in events[:-1]:
            for choice in e["choices"]:
                parts.setdefault(choice["index"], []).append(choice["delta"].get("content", ""))
                if choice["finish_reason"]:
                    statuses.append(e.get("response_format_status"))
        assert statuses == ["applied"] * 4
        for index in range(4):
            jsonschema.validate(json.loads("".join(parts[index])), PET_SCHEMA)


async def test_json_object_gives_a_json_object(post_chat, served):
    reply = await chat(
        post_chat,
        messages=PET_PROMPT,
        temperature=0,
        max_tokens=200,
        response_format={"type": "json_object"},
    )
    assert isinstance(json.loads(text(reply)), dict)
    assert reply["response_format_status"] == "applied"


async def test_a_value_cut_by_max_tokens_is_reported_not_enforced(post_chat, served):
    reply = await chat(
        post_chat, messages=PET_PROMPT, temperature=0, max_tokens=5, response_format=PET_FORMAT
    )
    assert reply["choices"][0]["finish_reason"] == "length"
    assert reply["response_format_status"] == "not_enforced"


async def test_response_format_statuses_without_a_grammar(post_chat, served):
    unknown = await chat(post_chat, temperature=0, response_format={"type": "yaml"})
    assert unknown["response_format_status"] == "ignored_unknown_type"
    assert text(unknown) == PARIS
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    with_tools = await chat(
        post_chat, temperature=0, tools=tools, response_format={"type": "json_object"}
    )
    assert with_tools["response_format_status"] == "ignored_tools_present"
    plain = await chat(post_chat, temperature=0)
    assert "response_format_status" not in plain


async def test_a_malformed_json_schema_is_a_400(post_chat, served):
    response = await post_chat(
        {"messages": HELLO, "response_format": {"type": "json_schema", "json_schema": 3}}
    )
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


# --- reasoning --------------------------------------------------------------------------


async def test_reasoning_budget_closes_the_think_block_then_answers(post_chat, thinker):
    reply = await chat(
        post_chat,
        model="thinker",
        messages=STORY,  # (asked for a capital, SmolLM2 answers and stops inside the block)
        temperature=0,
        max_tokens=60,
        enable_thinking=True,
        reasoning_budget=8,
    )
    message = reply["choices"][0]["message"]
    assert message.get("reasoning_content")
    assert 0 < reply["usage"]["completion_tokens_details"]["reasoning_tokens"] <= 8
    assert "<think>" not in message["content"] and "</think>" not in message["content"]
    assert message["content"].strip()


async def test_thinking_off_prefills_a_closed_block_and_all_is_content(post_chat, thinker):
    reply = await chat(post_chat, model="thinker", temperature=0, enable_thinking=False)
    message = reply["choices"][0]["message"]
    assert "reasoning_content" not in message
    assert message["content"]


async def test_streamed_reasoning_comes_before_content(post_chat, thinker):
    response = await post_chat(
        {
            "model": "thinker",
            "messages": HELLO,
            "temperature": 0,
            "max_tokens": 40,
            "stream": True,
            "enable_thinking": True,
            "reasoning_budget": 6,
        }
    )
    events = await read_stream(response)
    kinds = [key for e in events[1:-2] for key in e["choices"][0]["delta"] if key != "role"]
    assert kinds[0] == "reasoning_content"
    assert "content" in kinds
    first_content = kinds.index("content")
    assert "reasoning_content" not in kinds[first_content:]


async def test_reasoning_effort_turns_thinking_on_or_off(post_chat, thinker):
    """OpenAI's reasoning_effort as Responses' reasoning.effort: "minimal" (and "none")
    answer without thinking, the others think; enable_thinking, where given, wins."""
    off = await chat(post_chat, model="thinker", temperature=0, reasoning_effort="minimal")
    assert "reasoning_content" not in off["choices"][0]["message"]
    on = await chat(
        post_chat, model="thinker", temperature=0, max_tokens=40, reasoning_effort="low"
    )
    assert on["choices"][0]["message"].get("reasoning_content")
    overridden = await chat(
        post_chat, model="thinker", temperature=0, reasoning_effort="high", enable_thinking=False
    )
    assert "reasoning_content" not in overridden["choices"][0]["message"]


@pytest.mark.parametrize("effort", ["extreme", 3, ["low"]])
async def test_an_unknown_reasoning_effort_is_a_400_naming_it(post_chat, served, effort):
    response = await post_chat({"messages": HELLO, "reasoning_effort": effort})
    assert response.status_code == 400, response.content
    assert "reasoning_effort" in json.dumps(response.json()["error"])


async def test_a_non_think_template_returns_everything_as_content(post_chat, served):
    reply = await chat(post_chat, temperature=0, enable_thinking=True, reasoning_budget=2)
    assert text(reply) == PARIS
    assert "reasoning_content" not in reply["choices"][0]["message"]


async def test_the_schema_is_enforced_after_the_think_block(post_chat, thinker):
    """Reasoning is free text; the answer after `</think>` is held to the schema."""
    for seed in (1, 2):
        reply = await chat(
            post_chat,
            model="thinker",
            messages=PET_PROMPT,
            temperature=1.0,
            seed=seed,
            max_tokens=200,
            enable_thinking=True,
            reasoning_budget=8,
            response_format=PET_FORMAT,
        )
        message = reply["choices"][0]["message"]
        assert message.get("reasoning_content")
        jsonschema.validate(json.loads(message["content"]), PET_SCHEMA)
        assert reply["response_format_status"] == "applied"


async def test_a_schema_feature_the_grammar_cannot_express_is_named(post_chat, served):
    schema = {"type": "array", "items": {"type": "integer"}, "uniqueItems": True, "maxItems": 3}
    reply = await chat(
        post_chat,
        messages=PET_PROMPT,
        temperature=0,
        max_tokens=40,
        response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}},
    )
    # Greedy SmolLM2 answers [-1]: the rest of the schema held, uniqueItems was not.
    assert reply["response_format_status"] == "schema_downgraded"
    assert "uniqueItems" in reply["response_format_message"]
    value = json.loads(text(reply))
    assert len(value) <= 3 and all(isinstance(v, int) for v in value)
