"""The OpenAI Responses API through the unmodified official SDK against the real server
(Daphne in a subprocess, the shipped SmolLM2): plain, streamed (the events join to the
non-streamed body), a function tool round trip, previous_response_id served from the
session cache, retrieve and delete."""

from __future__ import annotations

import json

import pytest
from pydantic import BaseModel

from tests.e2e.daphne_server import running_server

MODEL = "smollm2-135m-instruct"
ASK = "What is the capital of France?"
WEATHER = {
    "type": "function",
    "name": "get_weather",
    "description": "The current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def sdk(tmp_path_factory, smollm2_path):
    openai = pytest.importorskip("openai")
    with running_server(
        tmp_path_factory.mktemp("pantheon-responses"), {MODEL: smollm2_path}
    ) as srv:
        yield openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=300)


def comparable(response) -> dict:
    """The response as JSON, with what differs between two runs of one request blanked:
    ids, times, and the cached tokens (the second run of a prompt is served from cache)."""
    body = response.model_dump(mode="json", exclude_none=True)
    body["id"] = body["created_at"] = None
    body.pop("completed_at", None)
    body["usage"]["input_tokens_details"]["cached_tokens"] = None
    for item in body["output"]:
        item["id"] = None
    return body


def test_a_plain_response(sdk):
    response = sdk.responses.create(
        model=MODEL, input=ASK, instructions="Be brief.", temperature=0, max_output_tokens=32
    )
    assert response.id.startswith("resp_") and response.model == MODEL
    assert response.status == "completed" and response.error is None
    assert "Paris" in response.output_text
    [message] = response.output
    assert message.type == "message" and message.role == "assistant"
    assert message.content[0].type == "output_text" and message.content[0].annotations == []
    usage = response.usage
    assert usage.input_tokens > 0 and 0 < usage.output_tokens <= 32
    assert usage.total_tokens == usage.input_tokens + usage.output_tokens
    assert usage.output_tokens_details.reasoning_tokens == 0
    assert response.instructions == "Be brief." and response.store is True


def test_a_cut_response_is_incomplete(sdk):
    response = sdk.responses.create(
        model=MODEL, input="Write a long poem about the sea.", temperature=0, max_output_tokens=16
    )
    assert response.status == "incomplete"
    assert response.incomplete_details.reason == "max_output_tokens"
    assert response.usage.output_tokens == 16 and response.output_text


def test_the_streamed_events_join_to_the_non_streamed_body(sdk):
    request = dict(model=MODEL, input=ASK, temperature=0, max_output_tokens=24)
    plain = sdk.responses.create(**request)
    with sdk.responses.stream(**request) as stream:
        events = list(stream)
        final = stream.get_final_response()
    types = [e.type for e in events]
    assert types[0] == "response.created" and types[1] == "response.in_progress"
    assert types[-1] == "response.completed"
    assert [e.sequence_number for e in events] == list(range(len(events)))
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert deltas == final.output_text == plain.output_text
    assert comparable(final) == comparable(plain)

    # stream=True: the raw typed events, the same again.
    raw = list(sdk.responses.create(**request, stream=True))
    assert comparable(raw[-1].response) == comparable(plain)
    assert "".join(e.delta for e in raw if e.type == "response.output_text.delta") == deltas


def test_previous_response_id_resumes_from_the_cache(sdk):
    first = sdk.responses.create(model=MODEL, input=ASK, temperature=0, max_output_tokens=24)
    follow = sdk.responses.create(
        model=MODEL,
        input="And of Germany?",
        previous_response_id=first.id,
        temperature=0,
        max_output_tokens=24,
    )
    assert follow.previous_response_id == first.id
    cached = follow.usage.input_tokens_details.cached_tokens
    # The first turn's prompt and answer came from the session cache.
    assert cached >= first.usage.input_tokens
    assert follow.usage.input_tokens > first.usage.total_tokens > 0
    assert follow.output_text


def test_a_function_tool_round_trip(sdk):
    ask = "What's the weather in Oslo?"
    first = sdk.responses.create(
        model=MODEL,
        input=ask,
        tools=[WEATHER],
        tool_choice="required",
        temperature=0,
        max_output_tokens=120,
    )
    assert first.status == "completed"
    [call] = [item for item in first.output if item.type == "function_call"]
    assert call.name == "get_weather" and call.status == "completed"
    assert set(json.loads(call.arguments)) == {"city"}
    answer = sdk.responses.create(
        model=MODEL,
        previous_response_id=first.id,
        input=[
            {
                "type": "function_call_output",
                "call_id": call.call_id,
                "output": json.dumps({"temperature_c": 21, "sky": "clear"}),
            }
        ],
        tools=[WEATHER],
        temperature=0,
        max_output_tokens=48,
    )
    assert answer.output_text and answer.usage.input_tokens_details.cached_tokens > 0
    # The same loop without storage: the client sends the whole conversation back.
    again = sdk.responses.create(
        model=MODEL,
        input=[
            {"role": "user", "content": ask},
            *[item.model_dump(exclude_none=True) for item in first.output],
            {"type": "function_call_output", "call_id": call.call_id, "output": "21 C, clear"},
        ],
        tools=[WEATHER],
        store=False,
        temperature=0,
        max_output_tokens=48,
    )
    assert again.output_text and again.store is False


def test_streamed_function_call_events(sdk):
    with sdk.responses.stream(
        model=MODEL,
        input="What's the weather in Paris?",
        tools=[WEATHER],
        tool_choice={"type": "function", "name": "get_weather"},
        temperature=0,
        max_output_tokens=120,
    ) as stream:
        events = list(stream)
        final = stream.get_final_response()
    [call] = [item for item in final.output if item.type == "function_call"]
    pieces = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    [done] = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert json.loads(pieces) == json.loads(done.arguments) == json.loads(call.arguments)
    added = [e.item for e in events if e.type == "response.output_item.added"]
    assert call.call_id in [getattr(item, "call_id", None) for item in added]


class Capital(BaseModel):
    country: str
    capital: str


def test_structured_output_through_parse(sdk):
    parsed = sdk.responses.parse(
        model=MODEL,
        input="France's capital, as JSON with country and capital.",
        text_format=Capital,
        temperature=0,
        max_output_tokens=60,
    )
    assert isinstance(parsed.output_parsed, Capital)


def test_retrieve_and_delete(sdk):
    import openai

    created = sdk.responses.create(model=MODEL, input=ASK, temperature=0, max_output_tokens=8)
    got = sdk.responses.retrieve(created.id)
    assert got.model_dump() == created.model_dump()
    sdk.responses.delete(created.id)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(created.id)
    with pytest.raises(openai.NotFoundError):
        sdk.responses.delete(created.id)
    unstored = sdk.responses.create(
        model=MODEL, input=ASK, temperature=0, max_output_tokens=8, store=False
    )
    with pytest.raises(openai.NotFoundError):
        sdk.responses.retrieve(unstored.id)
    with pytest.raises(openai.BadRequestError, match="input_image"):
        sdk.responses.create(
            model=MODEL,
            input=[
                {
                    "role": "user",
                    "content": [{"type": "input_image", "image_url": "https://example.com/a.png"}],
                }
            ],
        )


def test_the_same_answer_and_call_as_the_chat_route(sdk):
    """One chat core: a greedy request's text, and a compelled call, are the chat route's."""
    chat = sdk.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": ASK}], temperature=0, max_tokens=24
    )
    response = sdk.responses.create(model=MODEL, input=ASK, temperature=0, max_output_tokens=24)
    assert response.output_text == chat.choices[0].message.content
    assert response.usage.output_tokens == chat.usage.completion_tokens

    function = {k: WEATHER[k] for k in ("name", "description", "parameters", "strict")}
    ask = [{"role": "user", "content": "What's the weather in Oslo?"}]
    chat = sdk.chat.completions.create(
        model=MODEL,
        messages=ask,
        tools=[{"type": "function", "function": function}],
        tool_choice="required",
        temperature=0,
        max_tokens=120,
    )
    response = sdk.responses.create(
        model=MODEL,
        input=ask,
        tools=[WEATHER],
        tool_choice="required",
        temperature=0,
        max_output_tokens=120,
    )
    [chat_call] = chat.choices[0].message.tool_calls
    [call] = [item for item in response.output if item.type == "function_call"]
    assert call.name == chat_call.function.name
    assert json.loads(call.arguments) == json.loads(chat_call.function.arguments)
