"""Ollama's API (/api/...) on the real SmolLM2, in process: the chat and generate answers
(NDJSON streamed by default, one object with stream: false), options, format, tools,
think, the model routes (tags, show, ps, version), and every bad request answered in
Ollama's error shape ({"error": "message"}) with a 4xx."""

from __future__ import annotations

import asyncio
import json
import math

import jsonschema
import pytest

from tests.wire.helpers import CHAT, HELLO, AsgiCall
from tests.wire.openai_chat.test_chat_disconnect import LONG, closed_streams  # noqa: F401 (a fixture)

pytestmark = pytest.mark.anyio

MODEL = "smollm2-135m-instruct"
GREEDY = {"temperature": 0, "num_predict": 24}
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Current weather for a city.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string", "maxLength": 30}},
            "required": ["city"],
        },
    },
}


@pytest.fixture
def post(client):
    async def post(path, body, **headers):
        data = body if isinstance(body, bytes | str) else json.dumps(body)
        return await client.post(path, data=data, content_type="application/json", headers=headers)

    return post


@pytest.fixture
def small(served, smollm2_service):
    """SmolLM2 served as "small" with a 256-token window (a sibling over the same
    weights): over-window requests cost little."""
    from dataclasses import replace

    svc = smollm2_service.sibling(replace(smollm2_service.config, name="small", ctx_cap=256))
    served.register("small", svc)
    yield svc
    served.unregister("small")
    svc.close()


def chat_body(**extra) -> dict:
    return {"model": MODEL, "messages": HELLO, "stream": False, "options": GREEDY, **extra}


async def ndjson(response) -> list[dict]:
    assert response.status_code == 200, response.content
    assert response["Content-Type"] == "application/x-ndjson"
    raw = b"".join([chunk async for chunk in response.streaming_content])
    assert raw.endswith(b"\n")
    return [json.loads(line) for line in raw.decode().splitlines()]


def assert_final(body: dict) -> None:
    assert body["done"] is True
    for key in (
        "total_duration",
        "load_duration",
        "prompt_eval_count",
        "prompt_eval_duration",
        "eval_count",
        "eval_duration",
    ):
        assert isinstance(body[key], int) and body[key] >= 0, key
    assert body["prompt_eval_count"] > 0 and body["eval_count"] > 0
    assert body["total_duration"] >= body["prompt_eval_duration"] + body["eval_duration"]


def error_of(response, status: int) -> str:
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == {"error"} and isinstance(body["error"], str), body
    return body["error"]


# --- chat ----------------------------------------------------------------------------


async def test_chat_plain_is_one_object_with_the_counts(served, post):
    response = await post("/api/chat", chat_body())
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["model"] == MODEL
    assert body["message"]["role"] == "assistant" and body["message"]["content"]
    assert body["done_reason"] == "stop" and 0 < body["eval_count"] < 24
    assert_final(body)


async def test_chat_streams_ndjson_by_default_and_joins_to_the_plain_answer(served, post):
    plain = (await post("/api/chat", chat_body())).json()
    body = chat_body()
    del body["stream"]
    lines = await ndjson(await post("/api/chat", body))
    assert all(line["done"] is False for line in lines[:-1]) and lines[-1]["done"] is True
    text = "".join(line["message"]["content"] for line in lines)
    assert text == plain["message"]["content"]
    assert lines[-1]["message"]["content"] == ""
    assert lines[-1]["done_reason"] == plain["done_reason"]
    assert_final(lines[-1])


async def test_chat_text_equals_the_openai_chat_route_for_a_seeded_greedy_request(served, post):
    options = {"temperature": 0, "seed": 7, "num_predict": 32}
    ollama = (await post("/api/chat", chat_body(options=options))).json()
    openai = await post(CHAT, {"messages": HELLO, "temperature": 0, "seed": 7, "max_tokens": 32})
    assert openai.status_code == 200, openai.content
    assert ollama["message"]["content"] == openai.json()["choices"][0]["message"]["content"]
    assert ollama["eval_count"] == openai.json()["usage"]["completion_tokens"]
    assert ollama["prompt_eval_count"] == openai.json()["usage"]["prompt_tokens"]


async def test_a_latest_tag_and_an_alias_with_a_tag_resolve(served, post):
    response = await post("/api/chat", chat_body(model=MODEL + ":latest"))
    assert response.status_code == 200, response.content
    assert response.json()["model"] == MODEL + ":latest"  # as the client named it
    served.set_alias("tiny:q4", MODEL)
    assert (await post("/api/chat", chat_body(model="tiny:q4"))).status_code == 200
    # Another tag is not the served model: 404 even with one model loaded.
    error = error_of(await post("/api/chat", chat_body(model=MODEL + ":7b")), 404)
    assert "not found" in error and MODEL + ":latest" in error


async def test_stop_and_num_predict(served, post):
    full = (await post("/api/chat", chat_body())).json()["message"]["content"]
    word = full.split()[2]
    cut = (await post("/api/chat", chat_body(options={**GREEDY, "stop": [word]}))).json()
    assert word not in cut["message"]["content"] and cut["done_reason"] == "stop"
    short = await post("/api/chat", chat_body(options={"temperature": 0, "num_predict": 3}))
    assert short.json()["eval_count"] == 3 and short.json()["done_reason"] == "length"


async def test_unlimited_num_predict_takes_the_default_limit(served, post):
    for value in (-1, -2):
        body = chat_body(options={"temperature": 0, "num_predict": value})
        response = await post("/api/chat", body)
        assert response.status_code == 200, response.content
        assert response.json()["done_reason"] in ("stop", "length")


async def test_format_json_schema_is_enforced(served, post):
    schema = {
        "type": "object",
        "properties": {"capital": {"type": "string", "maxLength": 20}},
        "required": ["capital"],
    }
    body = chat_body(format=schema, options={"temperature": 0, "num_predict": 64})
    answer = (await post("/api/chat", body)).json()
    jsonschema.validate(json.loads(answer["message"]["content"]), schema)
    body = chat_body(format="json", options={"temperature": 0, "num_predict": 64})
    answer = (await post("/api/chat", body)).json()
    if answer["done_reason"] == "stop":
        assert isinstance(json.loads(answer["message"]["content"]), dict)


async def test_a_tool_round_trip_renders_and_answers(served, post):
    """A conversation with an earlier call (Ollama's shape: arguments an object, the
    result a `tool` message tied by tool_name) is rendered and answered."""
    messages = [
        {"role": "user", "content": "What's the weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [{"function": {"name": "get_weather", "arguments": {"city": "Paris"}}}],
        },
        {"role": "tool", "tool_name": "get_weather", "content": "18 C and sunny"},
    ]
    body = chat_body(messages=messages, tools=[WEATHER])
    response = await post("/api/chat", body)
    assert response.status_code == 200, response.content
    answer = response.json()
    assert answer["done"] is True and answer["prompt_eval_count"] > 0
    for call in answer["message"].get("tool_calls", []):
        assert call["function"]["name"] == "get_weather"
        assert isinstance(call["function"]["arguments"], dict)


async def test_a_tool_call_comes_back_in_ollamas_shape(served, post, settings):
    """Asked to use its only tool, SmolLM2 opens a call (greedy); with the call grammar
    masking an opened call (PANTHEON_TOOL_GRAMMAR=1: Ollama has no tool_choice) it is a
    well-formed get_weather call: Ollama's shape (arguments an object) in the joined
    answer, and as the streamed chunk before the final one."""
    settings.PANTHEON_TOOL_GRAMMAR = True
    ask = [{"role": "user", "content": "What's the weather in Paris? Use the tool."}]
    options = {"temperature": 0, "num_predict": 64}
    body = chat_body(messages=ask, tools=[WEATHER], options=options)
    plain = await post("/api/chat", body)
    assert plain.status_code == 200, plain.content
    (call,) = plain.json()["message"]["tool_calls"]
    assert call["function"]["name"] == "get_weather"
    # The value is the model's (the tool prompt shows no example value to copy: issue 35
    # item 3); SmolLM2 puts the city in it.
    assert list(call["function"]["arguments"]) == ["city"]
    assert "Paris" in call["function"]["arguments"]["city"]
    assert plain.json()["done_reason"] == "stop"
    lines = await ndjson(await post("/api/chat", {**body, "stream": True}))
    assert lines[-1]["done"] is True and lines[-1]["done_reason"] == "stop"
    (streamed,) = lines[-2]["message"]["tool_calls"]
    assert streamed["function"] == call["function"]
    for final in (plain.json(), lines[-1]):  # the answer is held-back call markup
        assert_durations_hold(final)


def assert_durations_hold(final: dict) -> None:
    """Every duration >= 0, and the phases add up to no more than the total."""
    names = ("total_duration", "load_duration", "prompt_eval_duration", "eval_duration")
    assert all(final[name] >= 0 for name in names), final
    phases = final["load_duration"] + final["prompt_eval_duration"] + final["eval_duration"]
    assert phases <= final["total_duration"]


@pytest.mark.parametrize("streamed", [False, True])
def test_an_answer_that_showed_nothing_has_no_negative_duration(streamed):
    """An answer whose every token was held back (tool markup) pushes no chunk: its first
    event is marked at the finish, not after it (eval_duration went negative: issue 35
    item 4)."""
    from engine import FinishEvent, Usage
    from wire.ollama.render import Answer, Clock

    clock = Clock()
    clock.mark_ready()
    answer = Answer(MODEL, chat=True, logprobs=False, clock=clock)
    finish = FinishEvent("tool_calls", Usage(5, 7, 0, 12, 128))
    final = answer.finish(finish)[-1] if streamed else answer.joined(finish)
    assert_durations_hold(final)
    assert final["eval_count"] == 7


async def test_think_on_a_think_template(served, thinker, post):
    body = chat_body(model="thinker", think=True, options={"temperature": 0, "num_predict": 48})
    answer = (await post("/api/chat", body)).json()
    assert answer["message"].get("thinking")
    off = (await post("/api/chat", {**body, "think": False})).json()
    assert "thinking" not in off["message"]
    assert (await post("/api/chat", {**body, "think": "high"})).status_code == 200
    # A model whose template has no think block cannot think: said, as Ollama says it.
    assert "thinking" in error_of(await post("/api/chat", {**body, "model": MODEL}), 400)
    assert (await post("/api/chat", {**body, "model": MODEL, "think": False})).status_code == 200


async def test_an_empty_conversation_is_the_load_answer(served, post):
    response = await post("/api/chat", {"model": MODEL, "messages": []})
    assert response.status_code == 200
    assert response.json()["done"] is True and response.json()["done_reason"] == "load"
    response = await post("/api/generate", {"model": MODEL, "keep_alive": 0})
    assert response.json()["done_reason"] == "load" and response.json()["response"] == ""


async def test_keep_alive_is_accepted(served, post):
    for value in ("5m", "1h30m", -1, 0, "0", 300.5):
        response = await post("/api/chat", chat_body(keep_alive=value))
        assert response.status_code == 200, (value, response.content)
    error_of(await post("/api/chat", chat_body(keep_alive="soon")), 400)


def test_keep_alive_reads_as_seconds():
    from wire.ollama.request import keep_alive_seconds

    cases = {"5m": 300.0, "1h30m": 5400.0, "300ms": 0.3, "0": 0.0, 0: 0.0, 2.5: 2.5, "90": 90.0}
    for value, seconds in cases.items():
        assert keep_alive_seconds(value) == pytest.approx(seconds), value
    for forever in ("-1", -1, "-1m", -0.5):
        assert keep_alive_seconds(forever) == math.inf
    assert keep_alive_seconds(None) is None


async def test_keep_alive_is_the_sessions_idle_ttl(served, post, smollm2_service):
    sessions = smollm2_service.sessions

    def ttl():
        (held,) = [s for key, s in sessions._sessions.items() if key.id == "ollama-ttl"]
        return held.idle_ttl_s

    header = {"X-Session-Id": "ollama-ttl"}
    await post("/api/chat", chat_body(keep_alive="5m"), **header)
    assert ttl() == 300.0
    await ndjson(await post("/api/chat", chat_body(keep_alive=-1, stream=True), **header))
    assert ttl() == math.inf  # streamed too; negative: kept until released
    sessions.reap()
    assert "ollama-ttl" in {info.session_id.id for info in smollm2_service.session_info()}
    await post("/api/chat", chat_body(keep_alive=0), **header)
    # 0: dropped as soon as its turn is over (the engine thread's own periodic reap may
    # already have done it by now)
    held = [s for key, s in sessions._sessions.items() if key.id == "ollama-ttl"]
    assert [s.idle_ttl_s for s in held] in ([], [0.0])
    sessions.reap()
    assert "ollama-ttl" not in {info.session_id.id for info in smollm2_service.session_info()}


async def test_hanging_up_mid_stream_stops_the_generation(asgi_app, served, closed_streams):  # noqa: F811
    body = {"model": MODEL, "messages": LONG, "options": {"temperature": 0, "num_predict": 400}}
    call = AsgiCall(asgi_app, "/api/chat", json.dumps(body).encode()).start()
    await call.wait_for(lambda c: sum(b'"content"' in x for x in c.chunks) >= 2, timeout=120)
    assert call.status == 200 and closed_streams == []
    call.hang_up.set()
    await asyncio.wait_for(call.task, 10)  # the handler returns; nothing hangs
    assert len(closed_streams) == 1  # the engine stream was closed: the generation stops
    assert b'"done":true' not in b"".join(call.chunks)


async def test_x_session_id_parks_the_conversation(served, post, smollm2_service):
    assert smollm2_service.session_info() == []
    await post("/api/chat", chat_body())
    assert smollm2_service.session_info() == []  # no session id: nothing parked
    first = (await post("/api/chat", chat_body(), **{"X-Session-Id": "ollama-cache"})).json()
    (info,) = smollm2_service.session_info()
    assert info.tokens >= first["prompt_eval_count"]
    error_of(await post("/api/chat", chat_body(), **{"X-Session-Id": "s" * 300}), 400)


# --- generate --------------------------------------------------------------------------


async def test_generate_plain_and_streamed(served, post):
    body = {"model": MODEL, "prompt": "What is the capital of France?", "options": GREEDY}
    plain = (await post("/api/generate", {**body, "stream": False})).json()
    assert plain["response"] and plain["done"] is True
    assert_final(plain)
    lines = await ndjson(await post("/api/generate", body))
    assert "".join(line["response"] for line in lines) == plain["response"]
    # Through the chat template: the same text as /api/chat with that one user turn.
    chat = (await post("/api/chat", chat_body())).json()
    assert plain["response"] == chat["message"]["content"]
    system = await post("/api/generate", {**body, "stream": False, "system": "Answer in French."})
    # SmolLM2's template has a default system prompt: `system` replaces it.
    assert system.json()["prompt_eval_count"] != plain["prompt_eval_count"]


async def test_generate_raw_renders_no_template(served, post, smollm2_service):
    """raw: the prompt as is. The chat template's own text for the conversation, sent
    raw, is the templated request's prompt: the same tokens, the same greedy text."""
    from engine.text.chat_template import normalize_messages

    rendered = smollm2_service.template.render(
        normalize_messages([dict(m) for m in HELLO]), add_generation_prompt=True
    )
    body = {"model": MODEL, "options": GREEDY, "stream": False}
    templated = (await post("/api/generate", {**body, "prompt": HELLO[0]["content"]})).json()
    raw = (await post("/api/generate", {**body, "prompt": rendered, "raw": True})).json()
    assert raw["prompt_eval_count"] == templated["prompt_eval_count"]
    assert raw["response"] == templated["response"]
    bare = (await post("/api/generate", {**body, "prompt": "Paris is", "raw": True})).json()
    assert bare["prompt_eval_count"] == len(smollm2_service.encode_raw("Paris is"))
    error = error_of(
        await post("/api/generate", {**body, "prompt": "x", "raw": True, "system": "s"}), 400
    )
    assert "system" in error


@pytest.mark.parametrize(
    ("extra", "field"),
    [
        ({"template": "{{ .Prompt }}"}, "template"),
        ({"suffix": "end"}, "suffix"),
        ({"context": [1, 2, 3]}, "context"),
        ({"images": ["aGVsbG8="]}, "images"),
    ],
)
async def test_generate_refuses_what_it_cannot_honour(served, post, extra, field):
    body = {"model": MODEL, "prompt": "Hi", "stream": False, **extra}
    assert field in error_of(await post("/api/generate", body), 400)


# --- validation ------------------------------------------------------------------------


async def test_num_ctx_above_the_window_is_refused_not_truncated(post, small):
    window = small.context_window
    body = chat_body(model="small")
    error = error_of(
        await post("/api/chat", {**body, "options": {**GREEDY, "num_ctx": window + 1}}), 400
    )
    assert "num_ctx" in error and str(window) in error
    for num_ctx in (window, 128):
        ok = await post("/api/chat", {**body, "options": {**GREEDY, "num_ctx": num_ctx}})
        assert ok.status_code == 200


async def test_an_unknown_model_is_404_even_with_one_loaded(served, post):
    assert "nope" in error_of(await post("/api/chat", chat_body(model="nope")), 404)
    assert error_of(await post("/api/generate", {"model": "nope", "prompt": "x"}), 404)
    assert error_of(await post("/api/show", {"model": "nope"}), 404)
    assert "required" in error_of(await post("/api/chat", {"messages": HELLO}), 400)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"options": {"temperature": "hot"}}, "options.temperature"),
        ({"options": {"num_predict": 1.5}}, "options.num_predict"),
        ({"options": {"top_k": True}}, "options.top_k"),
        ({"options": {"seed": "1"}}, "options.seed"),
        ({"options": {"stop": [1]}}, "options.stop"),
        ({"options": {"num_ctx": "big"}}, "options.num_ctx"),
        ({"options": {"repeat_penalty": 0}}, "options.repeat_penalty"),
        ({"options": {"top_p": 2}}, "options.top_p"),
        ({"options": "fast"}, "options"),
        ({"stream": "yes"}, "stream"),
        ({"format": "yaml"}, "format"),
        ({"think": "very"}, "think"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "robot", "content": "x"}]}, "messages.0.role"),
        ({"messages": [{"role": "user", "content": 5}]}, "messages.0.content"),
        (
            {"messages": [{"role": "user", "content": "x", "images": ["aGk="]}]},
            "messages.0.images",
        ),
        ({"tools": [{"type": "retrieval"}]}, "tools.0.type"),
        ({"messages": [*HELLO, {"role": "assistant", "content": "The"}]}, "messages.1"),
        ({"tools": {"a": 1}}, "tools"),
        ({"top_logprobs": 50}, "top_logprobs"),
    ],
)
async def test_bad_input_is_a_400_naming_the_field(served, post, body, field):
    assert field in error_of(await post("/api/chat", {**chat_body(), **body}), 400)


async def test_unknown_options_are_ignored(served, post):
    body = chat_body(options={**GREEDY, "num_thread": 8, "mirostat": 2, "whatever": "x"})
    assert (await post("/api/chat", body)).status_code == 200


async def test_a_bad_tool_is_a_400(served, post):
    bad = {"type": "function", "function": {"name": "x y", "parameters": "nope"}}
    error_of(await post("/api/chat", chat_body(tools=[bad])), 400)


async def test_a_body_that_is_no_json_object_is_a_400(served, post):
    error_of(await post("/api/chat", b"[1]"), 400)
    error_of(await post("/api/chat", b"{"), 400)


async def test_a_prompt_over_the_window_is_a_400(post, small):
    long = "hello " * (small.context_window + 10)
    body = chat_body(model="small", messages=[{"role": "user", "content": long}])
    assert "context" in error_of(await post("/api/chat", body), 400)


# --- models ----------------------------------------------------------------------------


async def test_nothing_loaded_is_a_503_in_ollamas_shape(empty_runtime, post, client):
    error = error_of(await post("/api/chat", chat_body()), 503)
    assert "no model" in error.lower() or "loaded" in error
    assert (await client.get("/api/tags")).json() == {"models": []}


async def test_tags_ps_show_version(served, client, post, smollm2_service):
    tags = (await client.get("/api/tags")).json()
    (row,) = tags["models"]
    assert row["name"] == row["model"] == MODEL + ":latest"
    assert row["size"] > 0 and row["digest"] == smollm2_service.weights_version
    assert row["details"] == {
        "parent_model": "",
        "format": "gguf",
        "family": "llama",
        "families": ["llama"],
        "parameter_size": "135M",
        "quantization_level": "Q4_1",
    }
    ps = (await client.get("/api/ps")).json()["models"][0]
    assert ps["size_vram"] == 0 and ps["context_length"] == smollm2_service.context_window
    assert ps["expires_at"]
    show = (await post("/api/show", {"model": MODEL})).json()
    assert show["template"] == smollm2_service.template.source
    info = show["model_info"]
    assert info["general.architecture"] == "llama"
    assert info["llama.context_length"] == 8192
    assert info["general.parameter_count"] > 100_000_000
    assert info["tokenizer.ggml.tokens"] is None  # long arrays, as Ollama without verbose
    verbose = (await post("/api/show", {"model": MODEL, "verbose": True})).json()
    assert len(verbose["model_info"]["tokenizer.ggml.tokens"]) == 49152
    assert f"num_ctx {smollm2_service.context_window}" in " ".join(show["parameters"].split())
    assert show["details"]["quantization_level"] == "Q4_1"
    assert "tools" in show["capabilities"]
    version = (await client.get("/api/version")).json()
    assert version["version"].count(".") == 2


async def test_aliases_are_listed_as_models(served, client):
    served.set_alias("tiny", MODEL)
    names = [row["name"] for row in (await client.get("/api/tags")).json()["models"]]
    assert names == sorted([MODEL + ":latest", "tiny:latest"])


async def test_model_management_is_refused_clearly(served, client, post):
    for action in ("pull", "push", "create", "copy"):
        error = error_of(await post(f"/api/{action}", {"model": MODEL}), 403)
        assert "operator" in error
    response = await client.delete(
        "/api/delete", data=json.dumps({"model": MODEL}), content_type="application/json"
    )
    error_of(response, 403)


async def test_wrong_methods(served, client, post):
    assert (await client.get("/api/chat")).status_code == 405
    error_of(await post("/api/tags", {}), 405)


# --- embeddings --------------------------------------------------------------------------


async def test_embed_single_batch_and_legacy(served, post, smollm2_service):
    width = smollm2_service.embedding_width
    texts = ["The cat sat on the mat.", "Paris is the capital of France."]
    batch = await post("/api/embed", {"model": MODEL, "input": texts})
    assert batch.status_code == 200, batch.content
    body = batch.json()
    assert body["model"] == MODEL and len(body["embeddings"]) == 2
    assert all(len(v) == width for v in body["embeddings"])
    assert body["prompt_eval_count"] == sum(len(smollm2_service.encode_raw(t)) for t in texts)
    for v in body["embeddings"]:
        assert abs(sum(x * x for x in v) - 1.0) < 1e-4  # L2-normalised
    alone = (await post("/api/embed", {"model": MODEL, "input": texts[1]})).json()
    assert alone["embeddings"][0] == body["embeddings"][1]  # the same bits alone
    legacy = (await post("/api/embeddings", {"model": MODEL, "prompt": texts[1]})).json()
    assert legacy["embedding"] == body["embeddings"][1]
    assert (await post("/api/embed", {"model": MODEL, "input": []})).json()["embeddings"] == []


async def test_embed_refusals_and_truncation(post, small):
    window = small.context_window_configured
    for long in ("hello " * (window + 50), "hello" * (window * 20)):
        body = {"model": "small", "input": long}
        assert "context" in error_of(await post("/api/embed", {**body, "truncate": False}), 400)
        cut = await post("/api/embed", body)  # truncate: Ollama's default
        assert cut.status_code == 200 and cut.json()["prompt_eval_count"] == window
    assert "dimensions" in error_of(
        await post("/api/embed", {"model": MODEL, "input": "x", "dimensions": 3}), 400
    )
    assert "input" in error_of(await post("/api/embed", {"model": MODEL, "input": [""]}), 400)
    assert "input" in error_of(await post("/api/embed", {"model": MODEL, "input": 5}), 400)
    error_of(await post("/api/embed", {"model": "nope", "input": "x"}), 404)


# --- scopes and limits -------------------------------------------------------------------


@pytest.mark.parametrize("path", ["/api/chat", "/api/generate", "/api/embed", "/api/embeddings"])
def test_the_conversation_routes_have_the_chat_routes_scope_and_body_limit(path):
    from pantheon_platform import routes

    chat = "/v1/chat/completions"
    assert routes.scope_for(path) == routes.scope_for(chat) == routes.INFERENCE
    assert routes.body_limit(path) == routes.body_limit(chat) == routes.LARGE_BODY_BYTES


@pytest.mark.parametrize("path", ["/api/tags", "/api/ps", "/api/show", "/api/version"])
def test_the_model_routes_have_the_inference_scope(path):
    from pantheon_platform import routes

    assert routes.scope_for(path) == routes.INFERENCE
    assert routes.body_limit(path) == routes.MANAGEMENT_BODY_BYTES


async def test_a_pathological_keep_alive_is_refused_without_backtracking(served, post):
    # Was a backtracking regex under the GIL: this string froze the whole process for 46 s.
    from pantheon_platform.durations import DURATION_MAX_CHARS, parse_duration

    hostile = "1" * 32000 + "!"
    assert parse_duration(hostile) is None and parse_duration("1" * 10**6) is None
    assert parse_duration("1" * DURATION_MAX_CHARS) == float("1" * DURATION_MAX_CHARS)
    error = error_of(await post("/api/chat", chat_body(keep_alive=hostile)), 400)
    assert "at most" in str(error) and hostile not in str(error)
    for near_miss in ("1" * 40 + "!", "5m30", "1h.", ".", "1..5s"):
        error_of(await post("/api/chat", chat_body(keep_alive=near_miss)), 400)
