"""Concurrency on the real server: eight streams at once equal the same requests one at
a time, and SIGTERM drains in-flight streams before Daphne exits 0.

One Daphne (eight slots) for the module; the SIGTERM test ends it, so it runs last.
"""

from __future__ import annotations

import json
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.e2e.daphne_server import Server, running_server

MODEL = "smollm2-135m-instruct"
TOPICS = ["the sea", "a cat", "mountains", "coffee", "the moon", "a library", "rain", "trains"]
COUNT = [{"role": "user", "content": "Count from 1 to 1000, separated by commas."}]

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def server(tmp_path_factory, smollm2_path):
    data_dir = tmp_path_factory.mktemp("pantheon-data")
    # A generous drain deadline: on a busy 2-core machine a decode step can take 10x longer.
    with running_server(
        data_dir, {MODEL: smollm2_path}, PANTHEON_MAX_CONCURRENT="8", PANTHEON_DRAIN_TIMEOUT="240"
    ) as srv:
        yield srv


def stream(server: Server, body: dict) -> dict:
    """One streamed completion: its text, finish reason, and when its chunks arrived."""
    started = time.monotonic()
    text, finish, first = [], None, None
    with httpx.stream(
        "POST", server.url + "/v1/chat/completions", json={**body, "stream": True}, timeout=300
    ) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            choice = json.loads(line[6:])["choices"][0]
            if choice["delta"].get("content"):
                first = first or time.monotonic()
                text.append(choice["delta"]["content"])
            finish = choice["finish_reason"] or finish
    return {
        "text": "".join(text),
        "finish": finish,
        "first": first,
        "end": time.monotonic(),
        "started": started,
    }


def test_the_server_serves_eight_slots(server):
    (row,) = httpx.get(server.url + "/v1/models").json()["data"]
    assert row["max_concurrent"] == 8


@pytest.mark.parametrize(
    "sampling",
    [{"temperature": 0}, {"temperature": 1.0, "seed": 4321}],
    ids=["greedy", "seeded-temperature-1"],
)
def test_eight_concurrent_streams_equal_the_same_requests_one_at_a_time(server, sampling):
    bodies = [
        {
            "messages": [{"role": "user", "content": f"Write one sentence about {topic}."}],
            "max_tokens": 16,
            **sampling,
        }
        for topic in TOPICS
    ]
    alone = [stream(server, body) for body in bodies]
    with ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda b: stream(server, b), bodies))
    assert [r["text"] for r in together] == [r["text"] for r in alone]
    assert [r["finish"] for r in together] == [r["finish"] for r in alone]
    assert len({r["text"] for r in alone}) == 8
    # They ran together: every stream had produced text before the first one ended.
    assert max(r["first"] for r in together) < min(r["end"] for r in together)


def test_sigterm_lets_the_in_flight_stream_finish_refuses_new_work_and_exits_0(server):
    body = {"messages": COUNT, "temperature": 0, "max_tokens": 24, "stream": True}
    lines = []
    with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=120) as r:
        assert r.status_code == 200
        it = r.iter_lines()
        while sum('"content"' in line for line in lines) < 2:
            lines.append(next(it))
        server.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)  # the handler runs on Daphne's main thread
        refused = httpx.post(
            server.url + "/v1/chat/completions", json={"messages": COUNT, "max_tokens": 1}
        )
        assert refused.status_code == 503, refused.text
        assert refused.headers["retry-after"] == "1"
        assert refused.json()["error"]["type"] == "server_shutting_down"
        assert httpx.get(server.url + "/").status_code == 200  # health still answers
        lines += list(it)  # the stream goes on to its end
    lines = [line for line in lines if line]
    data = [json.loads(x[6:]) for x in lines if x.startswith("data: {")]
    assert lines[-1] == "data: [DONE]"
    assert data[-1]["choices"][0]["finish_reason"] == "length"
    content = "".join(d["choices"][0]["delta"].get("content", "") for d in data)
    assert content.startswith("1.")
    assert server.proc.wait(60) == 0, server.log_tail()
    assert "drained" in server.log_tail()
