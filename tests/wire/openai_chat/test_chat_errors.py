"""POST /v1/chat/completions: every refusal, in the contract's error shape."""

from __future__ import annotations

import json

import pytest

from engine.types import (
    ContextOverBudget,
    FinishEvent,
    TokenEvent,
    Usage,
)
from tests.wire.helpers import HELLO, read_stream
from wire.openai_chat.request import ChatCompletionRequest, resolve_max_tokens

pytestmark = pytest.mark.anyio


def assert_error(response, status: int, type_: str) -> dict:
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert error["type"] == type_
    # OpenAI's own code for an overflow; null for every other error
    overflow = type_ == "context_over_budget"
    assert error["code"] == ("context_length_exceeded" if overflow else None)
    assert isinstance(error["message"], str) and error["message"]
    assert "Traceback" not in error["message"]
    assert response["Access-Control-Allow-Origin"] == "*"
    return error


# --- 400 invalid_request_error (no model needed: the edge refuses first) ---------


@pytest.mark.parametrize(
    "body,needle",
    [
        (b"", "empty"),
        (b"   ", "empty"),
        (b"{not json", "not valid JSON"),
        (b'{"messages": [], }', "not valid JSON"),
        (b"[1, 2]", "JSON object"),
        (b'"hello"', "JSON object"),
        (b"null", "JSON object"),
        (b'{"messages": NaN}', "not valid JSON"),
        (b"\xff\xfe", "not valid JSON"),
    ],
)
async def test_it_refuses_a_body_that_is_not_a_json_object(post_chat, empty_runtime, body, needle):
    error = assert_error(await post_chat(body), 400, "invalid_request_error")
    assert needle in error["message"]


async def test_content_type_is_not_checked(post_chat, empty_runtime):
    # The contract parses the body as JSON whatever the header says: here the request gets
    # past parsing and validation to the model lookup.
    response = await post_chat(json.dumps({"messages": HELLO}), content_type="text/plain")
    assert_error(response, 503, "no_models_loaded")


@pytest.mark.parametrize(
    "body,field",
    [
        ({}, "messages"),
        ({"messages": None}, "messages"),
        ({"messages": []}, "messages"),
        ({"messages": "hello"}, "messages"),
        ({"messages": {"role": "user"}}, "messages"),
        ({"messages": ["hello"]}, "messages[0]"),
        ({"messages": [{"role": "user", "content": "hi"}, 3]}, "messages[1]"),
        ({"messages": HELLO, "temperature": "hot"}, "temperature"),
        ({"messages": HELLO, "temperature": True}, "temperature"),
        ({"messages": HELLO, "top_p": "0.5"}, "top_p"),
        ({"messages": HELLO, "top_k": 1.5}, "top_k"),
        ({"messages": HELLO, "max_tokens": "x"}, "max_tokens"),
        ({"messages": HELLO, "max_completion_tokens": [1]}, "max_completion_tokens"),
        ({"messages": HELLO, "stream": "yes"}, "stream"),
        ({"messages": HELLO, "stream": 1}, "stream"),
        ({"messages": HELLO, "stop": 7}, "stop"),
        ({"messages": HELLO, "stop": ["ok", 7]}, "stop"),
        ({"messages": HELLO, "seed": "42"}, "seed"),
        ({"messages": HELLO, "n": 0}, "n"),
        ({"messages": HELLO, "n": "2"}, "n"),
        ({"messages": HELLO, "n": 1.5}, "n"),
        ({"messages": HELLO, "model": 5}, "model"),
        ({"messages": HELLO, "stream_options": "usage"}, "stream_options"),
        (
            {"messages": HELLO, "stream_options": {"include_usage": "yes"}},
            "stream_options.include_usage",
        ),
    ],
)
async def test_it_refuses_bad_fields_and_names_them(post_chat, empty_runtime, body, field):
    error = assert_error(await post_chat(body), 400, "invalid_request_error")
    assert error["message"].startswith(field + ":"), error["message"]


# --- max_tokens and the other sampling defaults -----------------------------------


@pytest.mark.parametrize(
    "max_tokens,max_completion_tokens,expected",
    [
        (None, None, 1024),
        (16, None, 16),
        (None, 16, 16),
        (16, 99, 16),  # max_tokens wins
        (0, None, 512),
        (-5, None, 512),
        (None, 0, 512),
        (10**9, None, 1_048_576),
    ],
)
def test_max_tokens_rules(max_tokens, max_completion_tokens, expected):
    assert resolve_max_tokens(max_tokens, max_completion_tokens) == expected


def test_sampling_params_defaults_and_overrides():
    request = ChatCompletionRequest(data={"messages": HELLO})
    assert request.is_valid(), request.errors
    params = request.sampling_params()
    assert (params.temperature, params.top_p, params.top_k) == (0.7, 0.95, 40)
    assert (params.max_tokens, params.stop, params.seed) == (1024, (), None)

    request = ChatCompletionRequest(
        data={
            "messages": HELLO,
            "temperature": 0,
            "top_p": 0.5,
            "top_k": 3,
            "max_completion_tokens": 7,
            "stop": "\n",
            "seed": 42,
            "stream": None,
        }
    )
    assert request.is_valid(), request.errors
    params = request.sampling_params()
    assert (params.temperature, params.top_p, params.top_k) == (0.0, 0.5, 3)
    assert (params.max_tokens, params.stop, params.seed) == (7, ("\n",), 42)
    assert request.is_stream is False


# --- errors from the runtime and the engine ---------------------------------------


async def test_no_models_loaded_is_503(post_chat, empty_runtime):
    error = assert_error(await post_chat({"messages": HELLO}), 503, "no_models_loaded")
    assert "PANTHEON_MODELS" in error["message"]


async def test_no_models_loaded_says_it_is_still_loading(post_chat, empty_runtime):
    from pantheon_platform.runtime import LOADING, ModelState

    empty_runtime._states["smollm2-135m-instruct"] = ModelState(LOADING)
    error = assert_error(await post_chat({"messages": HELLO}), 503, "no_models_loaded")
    assert "still loading" in error["message"]


async def test_one_loaded_model_serves_any_model_name(post_chat, served, monkeypatch):
    # Proven without generating: the request reaches the model's chat template.
    from engine.text.chat_template import ChatTemplateError

    svc = next(iter(served.services().values()))
    seen = []

    def prepare_chat(messages, *args):
        seen.append(messages)
        raise ChatTemplateError("stop here")

    monkeypatch.setattr(svc.prompts, "prepare_chat", prepare_chat)
    assert (await post_chat({"model": "gpt-4o", "messages": HELLO})).status_code == 400
    assert (await post_chat({"messages": HELLO})).status_code == 400
    assert seen == [HELLO, HELLO]


async def test_unknown_model_is_404_when_several_are_loaded(post_chat, served, smollm2_service):
    served.register("second-name", smollm2_service)
    error = assert_error(
        await post_chat({"model": "gpt-4o", "messages": HELLO}), 404, "model_not_found"
    )
    assert "gpt-4o" in error["message"]
    assert_error(await post_chat({"messages": HELLO}), 404, "model_not_found")


async def test_prompt_longer_than_the_window_is_400(post_chat, served, smollm2_service):
    window = smollm2_service.context_window
    giant = [{"role": "user", "content": "hello " * (window + 100)}]
    error = assert_error(await post_chat({"messages": giant}), 400, "context_over_budget")
    assert f"kv_cap={window}" in error["message"]
    assert "kv_used=" in error["message"]


async def test_streamed_prompt_longer_than_the_window_is_400_before_the_stream(
    post_chat, served, smollm2_service
):
    window = smollm2_service.context_window
    giant = [{"role": "user", "content": "hello " * (window + 100)}]
    response = await post_chat({"messages": giant, "stream": True})
    error = assert_error(response, 400, "context_over_budget")
    assert error["kv_cap"] == window
    assert error["kv_used"] > window


async def test_an_unexpected_failure_is_500_without_a_traceback(post_chat, served, monkeypatch):
    svc = next(iter(served.services().values()))

    def explode(messages, *args):
        raise RuntimeError("secret internals /home/x/engine.py line 12")

    monkeypatch.setattr(svc.prompts, "prepare_chat", explode)
    for stream in (False, True):
        response = await post_chat({"messages": HELLO, "stream": stream})
        error = assert_error(response, 500, "server_error")
        assert "secret" not in error["message"]
        assert b"Traceback" not in response.content


async def test_a_template_refusal_is_400(post_chat, served, monkeypatch):
    from engine.text.chat_template import ChatTemplateError

    svc = next(iter(served.services().values()))

    def refuse(messages, *args):
        raise ChatTemplateError("Conversation roles must alternate user/assistant")

    monkeypatch.setattr(svc.prompts, "prepare_chat", refuse)
    error = assert_error(await post_chat({"messages": HELLO}), 400, "invalid_request_error")
    assert "alternate" in error["message"]


# --- failures after the stream opened (the status line is already sent) ----------


def fake_stream(*events, then: Exception | None = None):
    """Stand-in for svc.generate: yields `events`, then raises `then`."""

    async def generate(request):
        for event in events:
            yield event
        if then is not None:
            raise then

    return generate


async def test_context_over_budget_mid_stream_is_a_terminal_error_event(
    post_chat, served, monkeypatch
):
    svc = next(iter(served.services().values()))
    token = TokenEvent(text="Hi", token_ids=(1,))
    monkeypatch.setattr(svc, "generate", fake_stream(token, then=ContextOverBudget(9000, 8192)))
    response = await post_chat({"messages": HELLO, "stream": True})
    assert response.status_code == 200
    events = await read_stream(response)
    assert events[0]["choices"][0]["delta"] == {"role": "assistant"}
    assert events[1]["choices"][0]["delta"] == {"content": "Hi"}
    error = events[-1]["error"]
    assert error["type"] == "context_over_budget"
    assert (error["kv_used"], error["kv_cap"]) == (9000, 8192)
    assert error["code"] == "context_length_exceeded"
    assert "[DONE]" not in events


async def test_other_failures_mid_stream_close_the_choice_with_stop(post_chat, served, monkeypatch):
    svc = next(iter(served.services().values()))
    token = TokenEvent(text="Hi", token_ids=(1,))
    monkeypatch.setattr(svc, "generate", fake_stream(token, then=RuntimeError("boom")))
    response = await post_chat({"messages": HELLO, "stream": True})
    events = await read_stream(response)
    assert events[-2]["choices"][0] == {"index": 0, "delta": {}, "finish_reason": "stop"}
    assert events[-1] == "[DONE]"
    assert "boom" not in json.dumps(events)


async def test_a_stream_that_ends_without_finish_is_500_before_it_opens(
    post_chat, served, monkeypatch
):
    svc = next(iter(served.services().values()))
    monkeypatch.setattr(svc, "generate", fake_stream())
    for stream in (False, True):
        response = await post_chat({"messages": HELLO, "stream": stream})
        assert_error(response, 500, "server_error")


async def test_usage_chunk_uses_the_finish_event(post_chat, served, monkeypatch):
    svc = next(iter(served.services().values()))
    usage = Usage(prompt_tokens=5, completion_tokens=1, cached_tokens=0, kv_used=6, kv_cap=8192)
    monkeypatch.setattr(
        svc,
        "generate",
        fake_stream(TokenEvent("x", (1,)), FinishEvent(finish_reason="length", usage=usage)),
    )
    body = {"messages": HELLO, "stream": True, "stream_options": {"include_usage": True}}
    events = await read_stream(await post_chat(body))
    assert events[-2]["choices"] == []
    assert events[-2]["usage"] == {
        "prompt_tokens": 5,
        "completion_tokens": 1,
        "total_tokens": 6,
        "prompt_tokens_details": {"cached_tokens": 0},
        "kv_used": 6,
        "kv_cap": 8192,
    }


async def test_a_body_over_the_upload_limit_is_400(post_chat, empty_runtime, settings):
    settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000
    body = {"messages": [{"role": "user", "content": "x" * 2000}]}
    error = assert_error(await post_chat(body), 400, "invalid_request_error")
    assert "DATA_UPLOAD_MAX_MEMORY_SIZE" in error["message"]
