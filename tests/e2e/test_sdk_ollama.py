"""Ollama's API through the unmodified `ollama` Python client against the real server
(Daphne, SmolLM2) with API keys on (the client sends its key as a bearer header): chat
and generate (plain and streamed), list, show, ps, tools, think, embed, and the errors
the client raises as ResponseError with their status."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.daphne_server import running_server
from tests.wire.helpers import THINK_TEMPLATE

MODEL = "smollm2-135m-instruct"
CLIENT_KEY = "sk-ollama-e2e-client"
ADMIN_KEY = "sk-ollama-e2e-admin"
HELLO = [{"role": "user", "content": "What is the capital of France?"}]
GREEDY = {"temperature": 0, "num_predict": 32}

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def server(tmp_path_factory, smollm2_path):
    pytest.importorskip("ollama")
    with running_server(
        tmp_path_factory.mktemp("pantheon-ollama"),
        {MODEL: smollm2_path},
        PANTHEON_API_KEY=CLIENT_KEY,
        PANTHEON_ADMIN_API_KEY=ADMIN_KEY,
        # Ollama has no tool_choice: an opened call is masked to a well-formed one.
        PANTHEON_TOOL_GRAMMAR="1",
    ) as srv:
        load = httpx.post(
            srv.url + "/admin/models/load",
            json={"path": str(smollm2_path), "name": "thinker", "chat_template": THINK_TEMPLATE},
            headers={"Authorization": f"Bearer {ADMIN_KEY}"},
            timeout=300,
        )
        assert load.status_code == 200, load.text
        yield srv


@pytest.fixture(scope="module")
def client(server):
    import ollama

    return ollama.Client(
        host=server.url, headers={"Authorization": f"Bearer {CLIENT_KEY}"}, timeout=300
    )


def get_weather(city: str) -> str:
    """Current weather for a city.

    Args:
      city: The city's name

    Returns:
      str: The weather
    """
    return "18 C and sunny"


def test_chat_plain_and_streamed_agree(client):
    plain = client.chat(model=MODEL, messages=HELLO, options=GREEDY)
    assert plain.done is True and plain.message.role == "assistant"
    assert "Paris" in plain.message.content
    assert plain.done_reason in ("stop", "length")
    assert plain.eval_count > 0 and plain.prompt_eval_count > 0
    assert plain.total_duration >= plain.prompt_eval_duration + plain.eval_duration > 0
    parts = list(client.chat(model=MODEL + ":latest", messages=HELLO, options=GREEDY, stream=True))
    assert len(parts) > 2 and all(not p.done for p in parts[:-1]) and parts[-1].done
    assert "".join(p.message.content for p in parts) == plain.message.content
    assert parts[-1].eval_count == plain.eval_count


def test_generate_plain_and_streamed_agree(client):
    plain = client.generate(model=MODEL, prompt=HELLO[0]["content"], options=GREEDY)
    assert plain.done is True and "Paris" in plain.response
    parts = list(
        client.generate(model=MODEL, prompt=HELLO[0]["content"], options=GREEDY, stream=True)
    )
    assert "".join(p.response for p in parts) == plain.response
    assert parts[-1].done and parts[-1].done_reason == plain.done_reason
    raw = client.generate(model=MODEL, prompt="The capital of France is", raw=True, options=GREEDY)
    assert raw.done is True and raw.prompt_eval_count < plain.prompt_eval_count


def test_list_show_ps(client):
    (row,) = [m for m in client.list().models if m.model == MODEL + ":latest"]
    assert row.size > 0 and row.details.format == "gguf" and row.details.family == "llama"
    assert row.details.quantization_level == "Q4_1" and row.details.parameter_size == "135M"
    assert {m.model for m in client.list().models} >= {MODEL + ":latest", "thinker:latest"}
    show = client.show(MODEL)
    assert show.modelinfo["general.architecture"] == "llama"
    assert show.modelinfo["llama.context_length"] == 8192
    assert "<|im_start|>" in show.template
    assert "num_ctx" in show.parameters and "tools" in show.capabilities
    assert "thinking" in client.show("thinker").capabilities
    ps = {m.model: m for m in client.ps().models}
    assert ps[MODEL + ":latest"].size_vram == 0 and ps[MODEL + ":latest"].context_length > 0


def test_a_tool_call_and_its_round_trip(client):
    ask = [{"role": "user", "content": "What's the weather in Paris? Use the tool."}]
    options = {"temperature": 0, "num_predict": 64}
    answer = client.chat(model=MODEL, messages=ask, tools=[get_weather], options=options)
    (call,) = answer.message.tool_calls
    assert call.function.name == "get_weather"
    assert set(call.function.arguments) == {"city"}  # the schema the client made
    streamed = list(
        client.chat(model=MODEL, messages=ask, tools=[get_weather], options=options, stream=True)
    )
    calls = [c for p in streamed for c in (p.message.tool_calls or [])]
    assert [c.function for c in calls] == [call.function]
    # The client's own round trip: its message (with the call) and the tool's result.
    history = [
        *ask,
        answer.message,
        {
            "role": "tool",
            "content": get_weather(**call.function.arguments),
            "tool_name": "get_weather",
        },
    ]
    final = client.chat(model=MODEL, messages=history, tools=[get_weather], options=options)
    assert final.done is True and final.prompt_eval_count > answer.prompt_eval_count


def test_think_on_a_think_template(client):
    answer = client.chat(model="thinker", messages=HELLO, think=True, options=GREEDY)
    assert answer.message.thinking
    off = client.chat(model="thinker", messages=HELLO, think=False, options=GREEDY)
    assert not off.message.thinking and off.message.content


def test_format_schema(client):
    schema = {
        "type": "object",
        "properties": {"capital": {"type": "string", "maxLength": 20}},
        "required": ["capital"],
    }
    import json

    answer = client.chat(
        model=MODEL, messages=HELLO, format=schema, options={"temperature": 0, "num_predict": 64}
    )
    assert isinstance(json.loads(answer.message.content)["capital"], str)


def test_embed(client):
    texts = ["The cat sat on the mat.", "Paris is the capital of France."]
    batch = client.embed(model=MODEL, input=texts)
    assert len(batch.embeddings) == 2 and len(batch.embeddings[0]) == 576
    alone = client.embed(model=MODEL, input=texts[1])
    assert list(alone.embeddings[0]) == list(batch.embeddings[1])
    legacy = client.embeddings(model=MODEL, prompt=texts[1])
    assert list(legacy.embedding) == list(batch.embeddings[1])


def test_errors_are_raised_with_their_status(client, server):
    import ollama

    with pytest.raises(ollama.ResponseError) as missing:
        client.chat(model="llama3", messages=HELLO)
    assert missing.value.status_code == 404 and "llama3" in missing.value.error
    with pytest.raises(ollama.ResponseError) as streamed:
        list(client.chat(model="llama3", messages=HELLO, stream=True))
    assert streamed.value.status_code == 404
    with pytest.raises(ollama.ResponseError) as pull:
        client.pull(MODEL)
    assert pull.value.status_code == 403 and "operator" in pull.value.error
    with pytest.raises(ollama.ResponseError) as ctx:
        client.chat(model=MODEL, messages=HELLO, options={"num_ctx": 1 << 20})
    assert ctx.value.status_code == 400 and "num_ctx" in ctx.value.error
    with pytest.raises(ollama.ResponseError) as bad:
        client.chat(model=MODEL, messages=HELLO, options={"temperature": "hot"})
    assert bad.value.status_code == 400
    # The inference scope: no key, no answer (the server's own error shape).
    keyless = httpx.get(server.url + "/api/tags", timeout=30)
    assert keyless.status_code == 401
    version = httpx.get(
        server.url + "/api/version", headers={"Authorization": f"Bearer {CLIENT_KEY}"}, timeout=30
    )
    assert version.status_code == 200 and version.json()["version"]
