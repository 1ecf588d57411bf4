"""One chat core, three wire formats: the same greedy conversation through OpenAI chat,
OpenAI Responses and Anthropic Messages (the unmodified official SDKs, a real Daphne)
gives the same text and the same tool call, and each format's stream joins to its own
non-streamed answer."""

from __future__ import annotations

import json

import pytest

from tests.e2e.daphne_server import running_server

MODEL = "smollm2-135m-instruct"
KEY = "sk-one-core-e2e"
SYSTEM = "You are a terse assistant. Answer in one sentence."
TURNS = [
    {"role": "user", "content": "Name a large river in Africa."},
    {"role": "assistant", "content": "The Nile."},
    {"role": "user", "content": "Which sea does it flow into?"},
]
CITY_TOOL = {
    "name": "get_weather",
    "description": "Current weather for a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 24}},
        "required": ["city"],
    },
}
ASK_WEATHER = [{"role": "user", "content": "What's the weather in Oslo?"}]
MAX_TOKENS = 40

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def server(tmp_path_factory, smollm2_path):
    pytest.importorskip("anthropic")
    with running_server(
        tmp_path_factory.mktemp("pantheon-one-core"), {MODEL: smollm2_path}, PANTHEON_API_KEY=KEY
    ) as srv:
        yield srv


@pytest.fixture(scope="module")
def openai_client(server):
    import openai

    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def anthropic_client(server):
    import anthropic

    return anthropic.Anthropic(base_url=server.url, api_key=KEY, max_retries=0, timeout=300)


# --- the three formats, each plain and streamed ----------------------------------------


def chat_text(client, stream: bool) -> str:
    messages = [{"role": "system", "content": SYSTEM}, *TURNS]
    args = dict(model=MODEL, messages=messages, max_tokens=MAX_TOKENS, temperature=0)
    if not stream:
        return client.chat.completions.create(**args).choices[0].message.content
    parts = [
        chunk.choices[0].delta.content or ""
        for chunk in client.chat.completions.create(**args, stream=True)
        if chunk.choices
    ]
    return "".join(parts)


def responses_text(client, stream: bool) -> str:
    args = dict(
        model=MODEL,
        instructions=SYSTEM,
        input=TURNS,
        max_output_tokens=MAX_TOKENS,
        temperature=0,
        store=False,
    )
    if not stream:
        return client.responses.create(**args).output_text
    deltas, final = [], None
    for event in client.responses.create(**args, stream=True):
        if event.type == "response.output_text.delta":
            deltas.append(event.delta)
        elif event.type in ("response.completed", "response.incomplete"):
            final = event.response.output_text
    assert final == "".join(deltas)
    return final


def messages_text(client, stream: bool) -> str:
    args = dict(
        model=MODEL,
        system=SYSTEM,
        messages=TURNS,
        max_tokens=MAX_TOKENS,
        extra_body={"temperature": 0},
    )
    if not stream:
        message = client.messages.create(**args)
    else:
        with client.messages.stream(**args) as events:
            deltas = "".join(events.text_stream)
            message = events.get_final_message()
        assert "".join(b.text for b in message.content if b.type == "text") == deltas
    return "".join(block.text for block in message.content if block.type == "text")


def test_the_same_greedy_text_through_every_format_streamed_or_not(openai_client, anthropic_client):
    texts = {
        "chat": chat_text(openai_client, False),
        "chat, streamed": chat_text(openai_client, True),
        "responses": responses_text(openai_client, False),
        "responses, streamed": responses_text(openai_client, True),
        "messages": messages_text(anthropic_client, False),
        "messages, streamed": messages_text(anthropic_client, True),
    }
    assert texts["chat"].strip(), texts
    assert len(set(texts.values())) == 1, json.dumps(texts, indent=1)


def test_the_same_compelled_tool_call_through_every_format(openai_client, anthropic_client):
    chat = openai_client.chat.completions.create(
        model=MODEL,
        messages=ASK_WEATHER,
        tools=[{"type": "function", "function": CITY_TOOL}],
        tool_choice="required",
        max_tokens=60,
        temperature=0,
    )
    [call] = chat.choices[0].message.tool_calls
    chat_call = (call.function.name, json.loads(call.function.arguments))

    response = openai_client.responses.create(
        model=MODEL,
        input=ASK_WEATHER,
        tools=[{"type": "function", "strict": False, **CITY_TOOL}],
        tool_choice="required",
        max_output_tokens=60,
        temperature=0,
        store=False,
    )
    [item] = [o for o in response.output if o.type == "function_call"]
    responses_call = (item.name, json.loads(item.arguments))

    message = anthropic_client.messages.create(
        model=MODEL,
        messages=ASK_WEATHER,
        tools=[
            {
                "name": CITY_TOOL["name"],
                "description": CITY_TOOL["description"],
                "input_schema": CITY_TOOL["parameters"],
            }
        ],
        tool_choice={"type": "any"},
        max_tokens=60,
        extra_body={"temperature": 0},
    )
    [use] = [block for block in message.content if block.type == "tool_use"]
    messages_call = (use.name, use.input)

    assert chat_call[0] == "get_weather" and isinstance(chat_call[1].get("city"), str)
    assert chat_call == responses_call == messages_call
