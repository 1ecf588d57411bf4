"""The access log: one JSON line per request on `pantheon.access`, written when the
response ends; the model and a hash of the session, never the prompt, the body, the
query string or a key."""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging

import pytest

from tests.access.asgi_raw import HOST, request, stack_app
from tests.wire.helpers import CHAT, sse_events

pytestmark = [pytest.mark.anyio, pytest.mark.django_db(transaction=True)]

PROMPT = "Tell me about the secret garden of Zanzibar-7731."
FIELDS = {"ts", "method", "route", "status", "bytes", "duration_ms"}


@pytest.fixture
def log_app():
    return stack_app()


class Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.records: list[str] = []

    def emit(self, record):
        self.records.append(record.getMessage())

    def parsed(self) -> list[dict]:
        return [json.loads(r) for r in self.records]


@pytest.fixture
def access_lines():
    """The lines on `pantheon.access` (its own handler: the logger does not propagate)."""
    logger = logging.getLogger("pantheon.access")
    handler = Lines()
    logger.addHandler(handler)
    level = logger.level
    logger.setLevel(logging.INFO)
    yield handler
    logger.removeHandler(handler)
    logger.setLevel(level)


def session_hash(session_id: str) -> str:
    return hashlib.sha256(session_id.encode()).hexdigest()[:12]


async def test_a_chat_is_one_line_with_model_and_hashed_session(log_app, served, access_lines):
    body = {
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 2,
        "temperature": 0,
        "session_id": "user-42-session",
    }
    reply = await request(log_app, "POST", CHAT, body, query="api_key=sekrit-query")
    assert reply.status == 200
    [line] = access_lines.parsed()
    assert FIELDS <= set(line)
    assert line["method"] == "POST" and line["route"] == "/v1/chat/completions"
    assert line["status"] == 200 and line["bytes"] == len(reply.body)
    assert isinstance(line["duration_ms"], float) and line["duration_ms"] > 0
    assert line["model"] == "smollm2-135m-instruct"
    assert line["session"] == session_hash("user-42-session")
    assert "aborted" not in line and "key" not in line
    raw = access_lines.records[0]
    for secret in ("Zanzibar", "user-42-session", "sekrit", "api_key"):
        assert secret not in raw


async def test_the_key_label_is_logged_never_the_key(log_app, served, access_lines, settings):
    settings.PANTHEON_API_KEY = "client-key-do-not-log"
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 1}
    headers = {"authorization": "Bearer client-key-do-not-log"}
    assert (await request(log_app, "POST", CHAT, body, headers=headers)).status == 200
    headers = {"x-api-key": "client-key-do-not-log"}
    assert (await request(log_app, "GET", "/v1/models", b"", headers=headers)).status == 200
    refused = await request(log_app, "GET", "/v1/models", b"", headers={"x-api-key": "wrong-k"})
    assert refused.status == 401
    lines = access_lines.parsed()
    assert [line["status"] for line in lines] == [200, 200, 401]
    assert lines[0]["key"] == lines[1]["key"] == "env:client"
    assert "key" not in lines[2]
    for raw in access_lines.records:
        assert "client-key-do-not-log" not in raw and "wrong-k" not in raw
        assert "Bearer" not in raw


async def test_one_line_per_request_whatever_the_answer(log_app, empty_runtime, access_lines):
    await request(log_app, "GET", "/", b"")
    await request(log_app, "POST", CHAT, b"{nope")
    await request(log_app, "POST", CHAT, b"", content_length=(64 << 20) + 1)
    await request(log_app, "GET", "/etc/passwd/<script>", b"")
    await request(log_app, "DELETE", "/admin/aliases/org/some-model", b"")
    lines = access_lines.parsed()
    assert [(x["method"], x["route"], x["status"]) for x in lines] == [
        ("GET", "/", 200),
        ("POST", "/v1/chat/completions", 400),
        ("POST", "/v1/chat/completions", 413),
        ("GET", "unmatched", 404),  # an unknown path is never echoed
        ("DELETE", "/admin/aliases/<path:alias>", 404),
    ]
    assert all(FIELDS <= set(x) for x in lines)
    assert "passwd" not in "".join(access_lines.records)


async def test_a_stream_is_logged_once_when_it_ends(log_app, served, access_lines):
    body = {
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": 4,
        "stream": True,
        "prompt_cache_key": "stream-session",
    }
    reply = await request(log_app, "POST", CHAT, body)
    assert sse_events(reply.body)[-1] == "[DONE]"
    [line] = access_lines.parsed()
    assert line["status"] == 200 and line["bytes"] == len(reply.body)
    assert line["model"] == "smollm2-135m-instruct"
    assert line["session"] == session_hash("stream-session")
    assert "aborted" not in line
    assert "Zanzibar" not in access_lines.records[0]


async def test_a_stream_the_client_leaves_is_logged_as_aborted(log_app, served, access_lines):
    """The client hangs up after the first chunk: the line comes when the server stops."""
    body = json.dumps(
        {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 400, "stream": True}
    ).encode()
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "POST",
        "scheme": "http",
        "path": CHAT,
        "raw_path": CHAT.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", HOST.encode()), (b"content-length", str(len(body)).encode())],
        "client": ("127.0.0.1", 50000),
        "server": ("127.0.0.1", 8000),
    }
    sent_body = False
    got_chunk = asyncio.Event()
    hang_up = asyncio.Event()

    async def receive():
        nonlocal sent_body
        if not sent_body:
            sent_body = True
            return {"type": "http.request", "body": body, "more_body": False}
        await hang_up.wait()
        return {"type": "http.disconnect"}

    async def send(message):
        if message["type"] == "http.response.body" and message.get("body"):
            got_chunk.set()

    task = asyncio.create_task(log_app(scope, receive, send))
    await asyncio.wait_for(got_chunk.wait(), 60)
    hang_up.set()
    await asyncio.wait_for(task, 60)
    [line] = access_lines.parsed()
    assert line["status"] == 200 and line["aborted"] is True
    assert line["model"] == "smollm2-135m-instruct" and "session" not in line


async def test_session_and_operator_routes_note_model_and_session(log_app, served, access_lines):
    await request(log_app, "POST", "/session/release", {"session_id": "rel-1"})
    await request(log_app, "POST", "/admin/models/unload", {"name": "nope"})
    release, unload = access_lines.parsed()
    assert release["route"] == "/session/release" and release["status"] == 200
    assert release["model"] == "smollm2-135m-instruct"
    assert release["session"] == session_hash("rel-1")
    assert unload["route"] == "/admin/models/unload" and unload["status"] == 404
    assert unload["model"] == "nope"


def test_the_logger_prints_at_info_to_stderr():
    from django.conf import settings

    config = settings.LOGGING["loggers"]["pantheon.access"]
    assert config["level"] == "INFO" and config["handlers"]
    handler = settings.LOGGING["handlers"][config["handlers"][0]]
    assert handler["class"] == "logging.StreamHandler"  # stderr by default
