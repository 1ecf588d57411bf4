"""GET /v1/models/{id}, llama.cpp's /health, the routes without /v1 (/models,
/models/{id}, /chat/completions), and the message checks at the edge: non-text content
parts and unknown roles refused, `developer` read as `system`, a compelled tool call
without tools refused. In-process (Django's client) with the real SmolLM2; the status
lines and the key/body layers over Daphne are tests/e2e/test_status_lines.py's."""

from __future__ import annotations

import asyncio
import json

import pytest
from django.test import Client

from pantheon_platform import routes
from pantheon_platform.runtime import FAILED, LOADING, ModelState
from tests.conftest import SMOLLM2_NAME

MODEL = SMOLLM2_NAME
HELLO = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture
def http() -> Client:
    return Client(enforce_csrf_checks=True)


def post(http: Client, path: str, body) -> object:
    data = body if isinstance(body, bytes) else json.dumps(body)
    return http.post(path, data=data, content_type="application/json")


def refused(response, status: int, type_: str) -> dict:
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == {"error"}, body
    assert body["error"]["type"] == type_, body
    assert body["error"]["message"] and "Traceback" not in body["error"]["message"]
    return body["error"]


# --- GET /v1/models/{id} -------------------------------------------------------------


def test_retrieve_is_the_row_the_list_has(http, served):
    listed = http.get("/v1/models").json()["data"]
    response = http.get(f"/v1/models/{MODEL}")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert [response.json()] == listed


def test_retrieve_of_an_unknown_id_is_404_model_not_found_even_with_one_model(http, served):
    # A completion's `model` routes anything to the only model; a retrieve does not.
    error = refused(http.get("/v1/models/gpt-4o"), 404, "model_not_found")
    assert "'gpt-4o'" in error["message"] and MODEL in error["message"]


def test_retrieve_follows_an_alias_to_its_model(http, served):
    served.set_alias("gpt-4o-mini", "chat-default")
    served.set_alias("chat-default", MODEL)
    response = http.get("/v1/models/gpt-4o-mini")
    assert response.status_code == 200
    assert response.json()["id"] == MODEL
    assert response.json() == http.get(f"/v1/models/{MODEL}").json()


def test_retrieve_takes_an_id_with_a_slash(http, served):
    served.set_alias("org/model", MODEL)
    assert http.get("/v1/models/org/model").json()["id"] == MODEL
    refused(http.get("/v1/models/org/other"), 404, "model_not_found")


def test_retrieve_says_a_model_is_still_loading(http, empty_runtime):
    empty_runtime._states["big"] = ModelState(LOADING)
    error = refused(http.get("/v1/models/big"), 404, "model_not_found")
    assert "still loading" in error["message"]


@pytest.mark.parametrize("method", ["post", "put", "delete"])
def test_retrieve_answers_get_only(http, empty_runtime, method):
    response = getattr(http, method)(f"/v1/models/{MODEL}")
    refused(response, 405, "method_not_allowed")
    assert "GET" in response["Allow"]


def test_the_openai_sdk_retrieves_a_model(served):
    """openai's own client (its URL building, its parsing) in process: httpx's ASGI
    transport into Django's ASGI application (over Daphne: tests/e2e/test_status_lines.py)."""
    openai = pytest.importorskip("openai")
    import httpx
    from django.core.asgi import get_asgi_application

    transport = httpx.ASGITransport(app=get_asgi_application())

    async def run():
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as h:
            sdk = openai.AsyncOpenAI(
                base_url="http://localhost/v1", api_key="x", http_client=h, max_retries=0
            )
            model = await sdk.models.retrieve(MODEL)
            with pytest.raises(openai.NotFoundError):
                await sdk.models.retrieve("no-such-model")
            return model

    model = asyncio.run(run())
    assert model.id == MODEL and model.object == "model" and model.owned_by == "pantheon"


# --- GET /health (llama.cpp) ---------------------------------------------------------


def test_health_is_ok_once_a_model_is_loaded(http, served):
    response = http.get("/health")
    assert response.status_code == 200
    assert response.content == b'{"status":"ok"}'


def test_health_is_503_loading_model_while_the_only_model_loads(http, empty_runtime):
    empty_runtime._states["big"] = ModelState(LOADING)
    response = http.get("/health")
    assert response.status_code == 503
    assert response.json() == {
        "error": {"code": 503, "message": "Loading model", "type": "unavailable_error"}
    }


def test_health_is_503_while_a_second_model_loads(http, served):
    served._states["second"] = ModelState(LOADING)
    assert http.get("/health").json()["error"]["message"] == "Loading model"


def test_health_is_503_while_the_loader_has_not_read_the_model_list(http, empty_runtime):
    empty_runtime._starting = True
    assert http.get("/health").json()["error"]["message"] == "Loading model"


def test_health_is_503_with_nothing_loaded(http, empty_runtime):
    empty_runtime._states["broken"] = ModelState(FAILED, "no such file")
    response = http.get("/health")
    assert response.status_code == 503
    assert response.json()["error"] == {
        "code": 503,
        "message": "No model loaded",
        "type": "unavailable_error",
    }


def test_health_is_ok_beside_a_model_that_failed(http, served):
    served._states["broken"] = ModelState(FAILED, "no such file")
    assert http.get("/health").status_code == 200


def test_health_is_503_while_the_server_drains(http, served, monkeypatch):
    from pantheon_platform import shutdown

    monkeypatch.setattr(shutdown, "draining", lambda: True)
    response = http.get("/health")
    assert response.status_code == 503
    assert response.json()["error"]["message"] == "Shutting down"


def test_health_needs_no_key_as_get_slash():
    assert routes.scope_for("/health") == routes.OPEN == routes.scope_for("/")


# --- the routes without /v1 ----------------------------------------------------------


def test_models_without_v1_is_the_same_list(http, served):
    assert http.get("/models").content == http.get("/v1/models").content
    assert http.get(f"/models/{MODEL}").content == http.get(f"/v1/models/{MODEL}").content
    refused(http.get("/models/nope"), 404, "model_not_found")


def test_chat_completions_without_v1_is_the_same_route(http, served):
    body = {"messages": HELLO, "max_tokens": 6, "temperature": 0}
    with_v1 = post(http, "/v1/chat/completions", body)
    without = post(http, "/chat/completions", body)
    assert with_v1.status_code == without.status_code == 200, without.content
    assert without.json()["choices"] == with_v1.json()["choices"]
    assert without.json()["usage"] == with_v1.json()["usage"]
    bad = b'{"messages": []}'
    assert (
        post(http, "/chat/completions", bad).content
        == post(http, "/v1/chat/completions", bad).content
    )
    refused(http.get("/chat/completions"), 405, "method_not_allowed")


@pytest.mark.parametrize(
    "path", ["/chat/completions", "/v1/messages", "/v1/messages/count_tokens", "/v1/responses"]
)
def test_every_conversation_route_has_the_chat_routes_scope_and_body_limit(path):
    chat = "/v1/chat/completions"
    assert routes.scope_for(path) == routes.scope_for(chat) == routes.INFERENCE
    assert routes.body_limit(path) == routes.body_limit(chat) == routes.LARGE_BODY_BYTES
    assert routes.body_class(path) == "large"


def test_models_without_v1_has_the_lists_scope():
    assert routes.scope_for("/models") == routes.scope_for("/v1/models")
    assert routes.scope_for("/models/x") == routes.scope_for("/v1/models/x")


# --- messages: roles and content parts -----------------------------------------------


@pytest.mark.parametrize(
    "part,why",
    [
        (
            {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
            "image_url parts are not supported: no loaded model can see images",
        ),
        (
            {"type": "input_audio", "input_audio": {"data": "AAAA", "format": "wav"}},
            "input_audio parts are not supported: no loaded model can hear audio",
        ),
        (
            {"type": "file", "file": {"file_id": "f"}},
            "file parts are not supported: no loaded model can read files",
        ),
        ({"type": "hologram"}, "hologram parts are not supported: only text parts are"),
        ({"text": "no type"}, 'messages[1].content[1].type: missing; expected "text"'),
        ({"type": "text", "text": 5}, "messages[1].content[1].text: Must be a string."),
        (7, "messages[1].content[1]: a content part must be an object"),
    ],
)
def test_a_part_the_models_cannot_take_is_refused_by_name(http, served, part, why):
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "What is this?"}, part]},
    ]
    error = refused(
        post(http, "/v1/chat/completions", {"messages": messages}), 400, "invalid_request_error"
    )
    assert why in error["message"]
    assert error["message"].startswith("messages[1].content[1]")
    assert error["param"].startswith("messages[1].content[1]")


def test_text_parts_are_read_as_the_string_they_join_to(http, served):
    as_parts = [
        {
            "role": "user",
            "content": [{"type": "text", "text": "What is the capital "}, "of France?"],
        }
    ]
    body = {"max_tokens": 6, "temperature": 0}
    parts = post(http, "/v1/chat/completions", {**body, "messages": as_parts})
    plain = post(http, "/v1/chat/completions", {**body, "messages": HELLO})
    assert parts.status_code == 200, parts.content
    assert parts.json()["choices"] == plain.json()["choices"]
    assert parts.json()["usage"] == plain.json()["usage"]


@pytest.mark.parametrize("role", ["robot", "function", "System", "model"])
def test_an_unknown_role_is_refused(http, served, role):
    messages = [{"role": "user", "content": "Hi"}, {"role": role, "content": "x"}]
    error = refused(
        post(http, "/v1/chat/completions", {"messages": messages}), 400, "invalid_request_error"
    )
    assert error["message"].startswith(f"messages[1].role: unknown role {role!r}")
    assert error["param"] == "messages[1].role"


def test_a_role_that_is_not_a_string_is_refused(http, served):
    body = {"messages": [{"role": ["user"], "content": "Hi"}]}
    error = refused(post(http, "/v1/chat/completions", body), 400, "invalid_request_error")
    assert error["param"] == "messages[0].role"


def test_developer_is_read_as_system(http, served):
    body = {"max_tokens": 8, "temperature": 0}
    sysmsg = [{"role": "system", "content": "Answer in French."}, *HELLO]
    devmsg = [{"role": "developer", "content": "Answer in French."}, *HELLO]
    as_system = post(http, "/v1/chat/completions", {**body, "messages": sysmsg})
    as_developer = post(http, "/v1/chat/completions", {**body, "messages": devmsg})
    assert as_developer.status_code == 200, as_developer.content
    assert as_developer.json()["choices"] == as_system.json()["choices"]
    assert as_developer.json()["usage"] == as_system.json()["usage"]


def test_a_missing_role_is_still_user(http, served):
    body = {"max_tokens": 4, "temperature": 0}
    missing = post(
        http, "/v1/chat/completions", {**body, "messages": [{"content": HELLO[0]["content"]}]}
    )
    assert missing.status_code == 200
    assert (
        missing.json()["choices"]
        == post(http, "/v1/chat/completions", {**body, "messages": HELLO}).json()["choices"]
    )


@pytest.mark.parametrize(
    "choice", ["required", {"type": "function", "function": {"name": "get_weather"}}]
)
def test_a_compelled_tool_call_without_tools_is_refused(http, served, choice):
    body = {"messages": HELLO, "tool_choice": choice}
    error = refused(post(http, "/v1/chat/completions", body), 400, "invalid_request_error")
    assert error["param"] == "tool_choice" and "needs `tools`" in error["message"]


@pytest.mark.parametrize("choice", ["auto", "none"])
def test_tool_choice_auto_or_none_without_tools_is_served(http, served, choice):
    body = {"messages": HELLO, "tool_choice": choice, "max_tokens": 1}
    assert post(http, "/v1/chat/completions", body).status_code == 200
