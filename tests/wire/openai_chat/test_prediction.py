"""OpenAI Predicted Outputs (`prediction`) and the `speculation` extension on
/v1/chat/completions: what is refused (a 400 naming the member at fault), what reaches the
chat core, the usage fields (completion_tokens_details.accepted_prediction_tokens and
rejected_prediction_tokens), and that the answer is the same with and without them."""

from __future__ import annotations

import importlib.util

import pytest

from engine import Usage
from tests.conftest import SMOLLM2_NAME as MODEL
from tests.wire.helpers import HELLO, read_stream
from wire.openai_chat.prediction import PREDICTION_MAX_CHARS, PREDICTION_MAX_PARTS
from wire.openai_chat.render import turn_of, usage_json
from wire.openai_chat.request import ChatCompletionRequest

pytestmark = pytest.mark.anyio

# The engine drafts (exact speculative decoding) once its speculation module is there;
# before that the usage fields are reported as 0.
ENGINE_DRAFTS = importlib.util.find_spec("engine.serving.speculation") is not None
GREEDY = {"model": MODEL, "messages": HELLO, "temperature": 0, "max_tokens": 24}


def refused(response, param: str) -> str:
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] is None
    assert error["param"] == param, error
    assert error["message"].startswith(param + ": "), error["message"]
    return error["message"]


# --- what is refused -------------------------------------------------------------------


@pytest.mark.parametrize(
    "prediction,param,says",
    [
        ("the answer", "prediction", "expected an object"),
        ([{"type": "content", "content": "x"}], "prediction", "expected an object"),
        ({"content": "x"}, "prediction.type", 'expected "content", got null'),
        ({"type": "text", "content": "x"}, "prediction.type", "got 'text'"),
        ({"type": 1, "content": "x"}, "prediction.type", "got integer"),
        ({"type": "content"}, "prediction.content", "a string or an array of text parts"),
        ({"type": "content", "content": 5}, "prediction.content", "a string or an array"),
        ({"type": "content", "content": ["x"]}, "prediction.content[0]", "a text part"),
        (
            {"type": "content", "content": [{"type": "image_url", "image_url": {}}]},
            "prediction.content[0].type",
            "only text parts",
        ),
        (
            {"type": "content", "content": [{"type": "text", "text": "a"}, {"type": "text"}]},
            "prediction.content[1].text",
            "Must be a string",
        ),
        (
            {"type": "content", "content": "x" * (PREDICTION_MAX_CHARS + 1)},
            "prediction.content",
            f"at most {PREDICTION_MAX_CHARS} characters",
        ),
        (
            {"type": "content", "content": [{"type": "text", "text": "x"}] * 1025},
            "prediction.content",
            f"at most {PREDICTION_MAX_PARTS} parts",
        ),
    ],
)
async def test_a_bad_prediction_is_a_400_naming_the_member(
    post_chat, empty_runtime, prediction, param, says
):
    message = refused(await post_chat({"messages": HELLO, "prediction": prediction}), param)
    assert says in message, message


@pytest.mark.parametrize("value", ["fast", "on", "", "AUTO", True, 1, ["auto"], {"mode": "off"}])
async def test_a_bad_speculation_is_a_400_naming_it(post_chat, empty_runtime, value):
    message = refused(await post_chat({"messages": HELLO, "speculation": value}), "speculation")
    assert '"auto" or "off"' in message


@pytest.mark.parametrize(
    "extra",
    [
        {"prediction": None, "speculation": None},
        {"prediction": {"type": "content", "content": ""}},
        {"prediction": {"type": "content", "content": []}, "speculation": "off"},
        {"prediction": {"type": "content", "content": "Paris"}, "speculation": "auto"},
    ],
)
async def test_good_values_get_past_validation(post_chat, empty_runtime, extra):
    # Nothing is loaded: a valid body gets as far as the model lookup.
    response = await post_chat({"messages": HELLO, **extra})
    assert response.status_code == 503, response.content


# --- what reaches the chat core ----------------------------------------------------------


def _turn(**fields):
    chat = ChatCompletionRequest(data={"messages": HELLO, **fields})
    assert chat.is_valid(), chat.errors
    return turn_of(chat, "chatcmpl-test")


def test_the_prediction_and_speculation_become_the_turns():
    assert (_turn().prediction, _turn().speculation) == (None, None)
    turn = _turn(prediction={"type": "content", "content": "def f():\n    return 1\n"})
    assert turn.prediction == "def f():\n    return 1\n"
    parts = [{"type": "text", "text": "def f():\n"}, {"type": "text", "text": "    return 1\n"}]
    assert _turn(prediction={"type": "content", "content": parts}).prediction == turn.prediction
    assert _turn(prediction={"type": "content", "content": []}).prediction == ""
    assert _turn(speculation="off").speculation == "off"
    assert _turn(speculation="auto").speculation == "auto"


# --- the usage object ------------------------------------------------------------------


def test_usage_reports_prediction_tokens_when_a_prediction_was_sent():
    usage = Usage(prompt_tokens=5, completion_tokens=9, cached_tokens=0, kv_used=14, kv_cap=64)
    assert "completion_tokens_details" not in usage_json(usage)  # as before
    assert usage_json(usage, predicted=True)["completion_tokens_details"] == {
        "reasoning_tokens": 0,
        "accepted_prediction_tokens": 0,
        "rejected_prediction_tokens": 0,
    }
    counted = Usage(
        prompt_tokens=5,
        completion_tokens=9,
        cached_tokens=0,
        kv_used=14,
        kv_cap=64,
        reasoning_tokens=2,
        accepted_prediction_tokens=6,
        rejected_prediction_tokens=3,
    )
    assert usage_json(counted, predicted=True)["completion_tokens_details"] == {
        "reasoning_tokens": 2,
        "accepted_prediction_tokens": 6,
        "rejected_prediction_tokens": 3,
    }
    thinking = Usage(
        prompt_tokens=5, completion_tokens=9, cached_tokens=0, kv_used=14, kv_cap=64,
        reasoning_tokens=4,
    )  # fmt: skip
    assert usage_json(thinking)["completion_tokens_details"] == {"reasoning_tokens": 4}


def _prediction_counts(usage: dict) -> tuple[int, int]:
    details = usage["completion_tokens_details"]
    accepted, rejected = (
        details["accepted_prediction_tokens"],
        details["rejected_prediction_tokens"],
    )
    assert isinstance(accepted, int) and isinstance(rejected, int)
    assert accepted >= 0 and rejected >= 0
    assert accepted <= usage["completion_tokens"]
    return accepted, rejected


async def test_the_greedy_answer_as_prediction_changes_nothing_but_the_usage(post_chat, served):
    plain = (await post_chat(GREEDY)).json()
    answer = plain["choices"][0]["message"]["content"]
    assert answer and "completion_tokens_details" not in plain["usage"]

    predicted = await post_chat({**GREEDY, "prediction": {"type": "content", "content": answer}})
    body = predicted.json()
    assert predicted.status_code == 200, body
    assert body["choices"] == plain["choices"]
    assert body["usage"]["completion_tokens"] == plain["usage"]["completion_tokens"]
    accepted, _ = _prediction_counts(body["usage"])
    if ENGINE_DRAFTS:
        assert accepted > 0

    off = await post_chat(
        {**GREEDY, "speculation": "off", "prediction": {"type": "content", "content": answer}}
    )
    assert off.json()["choices"] == plain["choices"]
    assert _prediction_counts(off.json()["usage"]) == (0, 0)  # off: nothing was drafted


async def test_a_wrong_prediction_changes_nothing(post_chat, served):
    plain = (await post_chat(GREEDY)).json()
    wrong = {"type": "content", "content": "Completely unrelated words about a quiet river. " * 4}
    body = (await post_chat({**GREEDY, "prediction": wrong})).json()
    assert body["choices"] == plain["choices"]
    _prediction_counts(body["usage"])


async def test_the_stream_reports_the_same_usage_and_text(post_chat, served):
    plain = (await post_chat(GREEDY)).json()
    answer = plain["choices"][0]["message"]["content"]
    body = {
        **GREEDY,
        "prediction": {"type": "content", "content": [{"type": "text", "text": answer}]},
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    events = await read_stream(await post_chat(body))
    assert events[-1] == "[DONE]"
    text = "".join(
        e["choices"][0]["delta"].get("content") or "" for e in events[:-2] if e["choices"]
    )
    assert text == answer
    usage = events[-2]["usage"]
    assert usage["completion_tokens"] == plain["usage"]["completion_tokens"]
    accepted, _ = _prediction_counts(usage)
    if ENGINE_DRAFTS:
        assert accepted > 0


async def test_the_openai_sdk_sends_a_prediction_and_reads_its_usage(served):
    """openai's own client in process (httpx's ASGI transport into Django's ASGI app):
    `chat.completions.create(prediction=...)` and usage.completion_tokens_details."""
    openai = pytest.importorskip("openai")
    import httpx
    from django.core.asgi import get_asgi_application

    transport = httpx.ASGITransport(app=get_asgi_application())
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as h:
        sdk = openai.AsyncOpenAI(
            base_url="http://localhost/v1", api_key="x", http_client=h, max_retries=0
        )
        plain = await sdk.chat.completions.create(
            model=MODEL, messages=HELLO, temperature=0, max_tokens=24
        )
        answer = plain.choices[0].message.content
        predicted = await sdk.chat.completions.create(
            model=MODEL,
            messages=HELLO,
            temperature=0,
            max_tokens=24,
            prediction={"type": "content", "content": answer},
        )
        with pytest.raises(openai.BadRequestError) as refused:
            await sdk.chat.completions.create(
                model=MODEL, messages=HELLO, prediction={"type": "content", "content": 7}
            )
    assert predicted.choices[0].message.content == answer
    details = predicted.usage.completion_tokens_details
    assert details is not None
    assert isinstance(details.accepted_prediction_tokens, int)
    assert isinstance(details.rejected_prediction_tokens, int)
    assert details.accepted_prediction_tokens >= 0 and details.rejected_prediction_tokens >= 0
    if ENGINE_DRAFTS:
        assert details.accepted_prediction_tokens > 0
    assert refused.value.body["param"] == "prediction.content"
