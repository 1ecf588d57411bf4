"""The real server: Daphne in a subprocess, the shipped SmolLM2, the OpenAI SDK and raw HTTP.

Nothing is mocked. The server is started once for the module (its own data dir, migrated
first) and killed at the end.
"""

from __future__ import annotations

import json
import socket
import time

import httpx
import pytest

from tests.e2e.daphne_server import Server, running_server

MODEL = "smollm2-135m-instruct"
NOT_FOUND = b'{"error":{"message":"unknown route","type":"not_found","code":null}}'
PARIS = [{"role": "user", "content": "What is the capital of France?"}]
POEM = [{"role": "user", "content": "Write a long poem about the sea."}]
COUNT = [{"role": "user", "content": "Count from 1 to 1000, separated by commas."}]

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def server(tmp_path_factory, smollm2_path):
    data = tmp_path_factory.mktemp("pantheon-data")
    with running_server(data, {MODEL: smollm2_path}, probe_while_loading=True) as srv:
        yield srv


@pytest.fixture(scope="module")
def sdk(server):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server.url + "/v1", api_key="x", max_retries=0, timeout=120)


def chat(server: Server, body, **kwargs) -> httpx.Response:
    content = body if isinstance(body, bytes) else json.dumps(body).encode()
    return httpx.post(server.url + "/v1/chat/completions", content=content, timeout=120, **kwargs)


def wait_until_free(server: Server, timeout: float = 15) -> httpx.Response:
    """A one-token answer, retried while the engine reports busy."""
    deadline = time.monotonic() + timeout
    while True:
        response = chat(server, {"messages": [{"content": "Hi"}], "max_tokens": 1})
        if response.status_code != 429 or time.monotonic() > deadline:
            return response
        time.sleep(0.2)


# --- while loading, and once loaded ------------------------------------------------


def test_it_answers_while_the_model_loads(server):
    if server.health_while_loading is None:
        pytest.skip("the model loaded before the first health check")
    assert server.health_while_loading["status"] == "ok"
    assert server.health_while_loading["models"] == {MODEL: "loading"}
    response = server.chat_while_loading
    assert response.status_code == 503
    error = response.json()["error"]
    assert error["type"] == "no_models_loaded" and "still loading" in error["message"]


def test_health_reports_the_loaded_model(server):
    response = httpx.get(server.url + "/")
    assert response.status_code == 200
    assert response.headers["access-control-allow-origin"] == "*"
    body = response.json()
    assert body["service"] == "pantheon" and body["status"] == "ok"
    assert body["backend"] in {"cpu", "cuda"}
    assert body["build"]
    assert body["accelerator"] is False
    assert body["models"] == {MODEL: "loaded"}


def test_sdk_lists_the_model(sdk):
    models = sdk.models.list()
    assert [m.id for m in models.data] == [MODEL]
    assert models.data[0].owned_by == "pantheon"
    assert models.data[0].context_window == 8192  # extra field, kept by the SDK


# --- the OpenAI SDK ----------------------------------------------------------------


def test_sdk_non_streamed_answer(sdk):
    completion = sdk.chat.completions.create(
        model=MODEL, messages=PARIS, temperature=0, max_tokens=16
    )
    assert completion.choices[0].message.content == "The capital of France is Paris."
    assert completion.choices[0].finish_reason == "stop"
    assert completion.usage.completion_tokens == 7


def test_sdk_streamed_answer_equals_non_streamed_and_arrives_while_generated(sdk):
    kwargs = {"model": MODEL, "messages": POEM, "temperature": 0, "max_tokens": 24}
    expected = sdk.chat.completions.create(**kwargs).choices[0].message.content

    started = time.monotonic()
    arrivals: list[tuple[float, str]] = []
    finish_reason = usage = None
    stream = sdk.chat.completions.create(
        **kwargs, stream=True, stream_options={"include_usage": True}
    )
    for chunk in stream:
        if chunk.usage is not None:
            usage = chunk.usage
        for choice in chunk.choices:
            if choice.delta.content:
                arrivals.append((time.monotonic() - started, choice.delta.content))
            finish_reason = choice.finish_reason or finish_reason
    ended = time.monotonic() - started

    assert "".join(text for _, text in arrivals) == expected
    assert finish_reason == "length"
    assert usage is not None and usage.completion_tokens == 24
    # Buffered whole, every chunk would land in the same instant at the end. Streamed,
    # the first token arrives while the rest is still being generated, and the rest in
    # several chunks (tokens decoded within PANTHEON_STREAM_INTERVAL_MS of the last
    # chunk join the next one).
    first = arrivals[0][0]
    assert len(arrivals) >= 3
    assert ended - first > 0.25 * ended, (first, ended)


def test_sdk_logprobs_json_schema_and_session_through_the_sdk(sdk):
    """The decoding surface and the prefix cache as the OpenAI SDK sees them."""
    completion = sdk.chat.completions.create(
        model=MODEL, messages=PARIS, temperature=0, max_tokens=16, logprobs=True, top_logprobs=3
    )
    content = completion.choices[0].logprobs.content
    assert "".join(t.token for t in content) == completion.choices[0].message.content
    assert all(len(t.top_logprobs) == 3 for t in content)

    schema = {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 20}, "big": {"type": "boolean"}},
        "required": ["city", "big"],
        "additionalProperties": False,
    }
    stream = sdk.chat.completions.create(
        model=MODEL,
        messages=PARIS,
        temperature=1.0,
        seed=5,
        max_tokens=80,
        stream=True,
        response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema}},
    )
    text = "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    value = json.loads(text)
    assert set(value) == {"city", "big"}

    first = sdk.chat.completions.create(
        model=MODEL, messages=PARIS, temperature=0, max_tokens=16, extra_body={"session_id": "e2e"}
    )
    turn_2 = [
        *PARIS,
        {"role": "assistant", "content": first.choices[0].message.content},
        {"role": "user", "content": "And of Germany?"},
    ]
    second = sdk.chat.completions.create(
        model=MODEL, messages=turn_2, temperature=0, max_tokens=16, extra_body={"session_id": "e2e"}
    )
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached == first.usage.prompt_tokens + first.usage.completion_tokens


# --- raw HTTP: errors and headers --------------------------------------------------


@pytest.mark.parametrize("method", ["GET", "POST", "DELETE"])
def test_unknown_route_is_the_exact_404(server, method):
    response = httpx.request(method, server.url + "/v1/nothing-here")
    assert response.status_code == 404
    assert response.content == NOT_FOUND
    assert response.headers["access-control-allow-origin"] == "*"


def test_options_on_any_path(server):
    for path in ("/", "/v1/chat/completions", "/no/such/route"):
        response = httpx.options(server.url + path)
        assert response.status_code == 200
        assert response.json() == {}
        assert response.headers["access-control-allow-origin"] == "*"


@pytest.mark.parametrize(
    "body,status,type_",
    [
        (b"", 400, "invalid_request_error"),
        (b"{oops", 400, "invalid_request_error"),
        (b"[]", 400, "invalid_request_error"),
        (b"{}", 400, "invalid_request_error"),
        (b'{"messages": []}', 400, "invalid_request_error"),
        (b'{"messages": "hi"}', 400, "invalid_request_error"),
        (b'{"messages": [{"content": "hi"}], "temperature": "hot"}', 400, "invalid_request_error"),
        (b'{"messages": [{"content": "hi"}], "stream": "yes"}', 400, "invalid_request_error"),
    ],
)
def test_chat_refusals_are_in_the_error_shape(server, body, status, type_):
    response = chat(server, body)
    assert response.status_code == status
    assert response.headers["access-control-allow-origin"] == "*"
    error = response.json()["error"]
    assert error["type"] == type_ and error["code"] is None and error["message"]


def test_wrong_method_is_405(server):
    response = httpx.get(server.url + "/v1/chat/completions")
    assert response.status_code == 405
    assert response.json()["error"]["type"] == "method_not_allowed"


@pytest.mark.parametrize("stream", [False, True])
def test_prompt_over_the_window_is_400(server, stream):
    giant = [{"role": "user", "content": "hello " * 9000}]
    response = chat(server, {"messages": giant, "stream": stream})
    assert response.status_code == 400
    error = response.json()["error"]
    assert error["type"] == "context_over_budget"
    assert "kv_cap=8192" in error["message"]
    if stream:
        assert error["kv_cap"] == 8192 and error["kv_used"] > 8192


def test_streaming_headers(server):
    body = {"messages": PARIS, "temperature": 0, "max_tokens": 2, "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        assert r.headers["content-type"] == "text/event-stream"
        assert r.headers["cache-control"] == "no-cache"
        assert r.headers["x-accel-buffering"] == "no"
        assert r.headers["access-control-allow-origin"] == "*"
        lines = [line for line in r.iter_lines() if line]
    assert lines[-1] == "data: [DONE]"


# --- concurrency and disconnects ---------------------------------------------------


def test_a_second_request_runs_beside_a_stream_and_a_hung_up_stream_frees_its_slot(server):
    assert wait_until_free(server).status_code == 200
    body = {"messages": COUNT, "temperature": 0, "max_tokens": 1000, "stream": True}
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        lines = r.iter_lines()
        contents = 0
        while contents < 3:
            contents += '"content"' in next(lines)
        # The batch scheduler decodes it beside the open stream.
        beside = chat(server, {"messages": PARIS, "temperature": 0, "max_tokens": 16})
        assert beside.status_code == 200
        assert beside.json()["choices"][0]["message"]["content"] == (
            "The capital of France is Paris."
        )
    # The client hung up mid-stream (the `with` closed the connection). Without the abort
    # its slot would stay taken for up to 1000 tokens.
    after = wait_until_free(server)
    assert after.status_code == 200, after.text
    assert server.proc.poll() is None


def test_server_survives_a_client_that_vanishes(server):
    # A raw socket that sends a streaming request, reads a little and closes hard.
    host, port = server.url.removeprefix("http://").split(":")
    payload = json.dumps({"messages": COUNT, "max_tokens": 1000, "stream": True}).encode()
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(
            b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )
        assert sock.recv(4096).startswith(b"HTTP/1.1 ")
    response = wait_until_free(server)
    assert response.status_code == 200
    assert httpx.get(server.url + "/").status_code == 200
