"""Over a real Daphne: every status this server answers carries its standard reason
phrase on the status line (Twisted's table has no 422 or 429: it wrote `422 Unknown
Status`), and the routes real clients reach without our docs' help: llama.cpp's /health
(open, no key), GET /v1/models/{id} through the official openai SDK, and the spellings
without /v1 (/models, /chat/completions) with the /v1 routes' key check and body limit.

One server: one API key, one session slot, a 128-token window, the shipped SmolLM2.
The last test unloads the model (the 503s)."""

from __future__ import annotations

import http.client
import json
from http import HTTPStatus

import pytest

from pantheon_platform import openapi
from pantheon_site import daphne_hooks
from tests.e2e.daphne_server import Server, running_server

MODEL = "smollm2-135m-instruct"
KEY = "status-line-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
CHAT = "/v1/chat/completions"

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def srv(tmp_path_factory, smollm2_path):
    env = {"PANTHEON_API_KEY": KEY, "PANTHEON_MAX_SESSIONS": "1", "PANTHEON_CTX_CAP": "128"}
    with running_server(tmp_path_factory.mktemp("status-lines"), {MODEL: smollm2_path}, **env) as s:
        yield s


class Reply:
    def __init__(self, response: http.client.HTTPResponse):
        self.status = response.status
        self.reason = response.reason
        self.headers = {k.lower(): v for k, v in response.getheaders()}
        self.body = response.read()

    def json(self):
        return json.loads(self.body)


def call(
    srv: Server,
    method: str,
    path: str,
    body: bytes | dict | None = None,
    headers: dict | None = None,
) -> Reply:
    """One request on its own connection (http.client: the status line as sent)."""
    host, port = srv.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=120)
    try:
        data = json.dumps(body).encode() if isinstance(body, dict) else body
        all_headers = {"Content-Type": "application/json", **(headers or {})}
        conn.request(method, path, body=data, headers=all_headers)
        return Reply(conn.getresponse())
    finally:
        conn.close()


def declared_only(srv: Server, path: str, length: int, headers: dict) -> Reply:
    """Headers declaring a `length`-byte body, none of it sent: the early refusals."""
    host, port = srv.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=30)
    try:
        conn.putrequest("POST", path)
        for name, value in {"Content-Length": str(length), **headers}.items():
            conn.putheader(name, value)
        conn.endheaders()
        return Reply(conn.getresponse())
    finally:
        conn.close()


def assert_line(reply: Reply, status: int) -> None:
    assert reply.status == status, (reply.status, reply.body[:400])
    assert reply.reason == HTTPStatus(status).phrase, f"{status} {reply.reason}"


def long_prompt(words: int) -> dict:
    return {"messages": [{"role": "user", "content": "word " * words}], "max_tokens": 1}


# --- the reason phrases ------------------------------------------------------------------


def test_an_overflow_reads_bad_request(srv):
    reply = call(srv, "POST", CHAT, long_prompt(400), AUTH)
    assert_line(reply, 400)
    assert reply.json()["error"]["code"] == "context_length_exceeded"


def test_429_reads_too_many_requests(srv):
    for i in range(3):  # one session slot: a second session id is refused
        body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1}
        reply = call(srv, "POST", CHAT, {**body, "session_id": f"s{i}"}, AUTH)
        if reply.status != 200:
            break
    assert_line(reply, 429)
    assert "retry-after" in reply.headers


@pytest.mark.parametrize(
    "status,method,path,body,headers",
    [
        (200, "GET", "/health", None, {}),
        (200, "GET", "/v1/models", None, AUTH),
        (400, "POST", CHAT, b"not json", AUTH),
        (401, "POST", CHAT, b"{}", {}),
        (403, "GET", "/v1/models", None, {**AUTH, "Host": "evil.example"}),
        (404, "GET", f"/v1/models/{MODEL}-nope", None, AUTH),
        (404, "GET", "/no/such/route", None, AUTH),
        (405, "GET", CHAT, None, AUTH),
        (415, "POST", "/admin/models/unload", b"name=x", {**AUTH, "Content-Type": "text/plain"}),
    ],
)
def test_each_status_has_its_standard_reason_phrase(srv, status, method, path, body, headers):
    assert_line(call(srv, method, path, body, headers), status)


def test_409_reads_conflict(srv, smollm2_path):
    body = {"path": str(smollm2_path), "name": MODEL}
    reply = call(srv, "POST", "/admin/models/load", body, AUTH)
    assert_line(reply, 409)


def test_413_reads_request_entity_too_large(srv):
    reply = declared_only(srv, "/admin/models/unload", 5 * 1024 * 1024, AUTH)
    assert_line(reply, 413)


def test_every_documented_status_gets_the_standard_phrase_from_the_request_class():
    """What the wire tests cannot provoke (500, 507): the status line the request class
    writes for every status the OpenAPI document lists."""
    request_class = daphne_hooks._request_class()
    for status in sorted({200, 406, 501, *openapi.ERRORS}):
        request = request_class.__new__(request_class)  # setResponseCode needs no state
        request.setResponseCode(status)
        assert request.code_message == HTTPStatus(status).phrase.encode(), status


# --- the routes clients reach ------------------------------------------------------------


def test_health_needs_no_key_and_is_llama_cpps_shape(srv):
    reply = call(srv, "GET", "/health")
    assert_line(reply, 200)
    assert reply.body == b'{"status":"ok"}'
    assert reply.headers["access-control-allow-origin"] == "*"


def test_the_openai_sdk_retrieves_a_model(srv):
    openai = pytest.importorskip("openai")
    sdk = openai.OpenAI(base_url=srv.url + "/v1", api_key=KEY, max_retries=0, timeout=60)
    model = sdk.models.retrieve(MODEL)
    assert model.id == MODEL and model.owned_by == "pantheon"
    assert (
        model.model_dump(exclude_unset=True)
        == call(srv, "GET", "/v1/models", headers=AUTH).json()["data"][0]
    )
    with pytest.raises(openai.NotFoundError) as caught:
        sdk.models.retrieve("gpt-4o")
    assert caught.value.body["type"] == "model_not_found"


def test_the_openai_sdk_with_a_base_url_without_v1(srv):
    openai = pytest.importorskip("openai")
    sdk = openai.OpenAI(base_url=srv.url, api_key=KEY, max_retries=0, timeout=120)
    assert [m.id for m in sdk.models.list()] == [MODEL]
    assert sdk.models.retrieve(MODEL).id == MODEL
    reply = sdk.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=2,
    )
    assert reply.choices[0].finish_reason in {"stop", "length"}


def test_chat_without_v1_has_the_key_check_and_the_large_body_limit(srv):
    assert_line(call(srv, "POST", "/chat/completions", long_prompt(3), {}), 401)
    # Over the management limit (4 MiB), under the chat one (64 MiB): read, parsed, and
    # refused for the window, as on /v1/chat/completions.
    body = json.dumps(long_prompt(1_100_000)).encode()
    assert len(body) > 5 * 1024 * 1024
    for path in ("/chat/completions", CHAT):
        reply = call(srv, "POST", path, body, AUTH)
        assert_line(reply, 400)
    over = declared_only(srv, "/chat/completions", 65 * 1024 * 1024, AUTH)
    assert_line(over, 413)
    assert "chat" in over.json()["error"]["message"]


def test_503_reads_service_unavailable_and_health_follows(srv):
    """Last: the model is unloaded."""
    reply = call(srv, "POST", "/admin/models/unload", {"name": MODEL}, AUTH)
    assert reply.status == 200, reply.body
    assert_line(call(srv, "POST", CHAT, long_prompt(3), AUTH), 503)
    health = call(srv, "GET", "/health")
    assert_line(health, 503)
    assert health.json() == {
        "error": {"code": 503, "message": "No model loaded", "type": "unavailable_error"}
    }
