"""The router's answers when an instance is down or dies, on a cluster of its own
(tests/cluster/conftest.py): a stored response's requests wait for its instance (then 503
with Retry-After, never a replica's 404); a request whose instance failed before its status line
with no other instance left is 502 instance_failed (with one left it is sent again:
test_router.py's kill test); the router's access log names forwarded routes. In file
order: the last test leaves no instance serving."""

from __future__ import annotations

import concurrent.futures
import json
import signal
import threading
import time

import pytest

from tests.cluster.conftest import CLIENT_KEY, HOLDER_WAIT_MS
from tests.conftest import SMOLLM2_NAME

pytestmark = pytest.mark.timeout(300)

QUESTION = [{"role": "user", "content": "Name three colours."}]
COUNTING = [{"role": "user", "content": "Count from 1 to 2000, one number per line."}]
LONG_JSON = {"messages": COUNTING, "max_tokens": 4000, "temperature": 0}


def test_a_stored_responses_requests_wait_for_its_instance_not_a_replicas_404(cluster):
    """While the instance that stored a response is down, GET, its input items and a
    chained request are 503 instance_unavailable with Retry-After (a replica never had
    it: it would answer 404); once the instance is back, they are answered there."""
    respond = {"model": SMOLLM2_NAME, "temperature": 0, "max_output_tokens": 4}
    made = cluster.post("/v1/responses", {**respond, "input": "Hi"})
    assert made.status_code == 200, made.text
    rid, holder = made.json()["id"], made.headers["x-pantheon-instance"]
    chained = {**respond, "input": "More", "previous_response_id": rid}
    about = [
        lambda: cluster.get(f"/v1/responses/{rid}", key=CLIENT_KEY),
        lambda: cluster.get(f"/v1/responses/{rid}/input_items", key=CLIENT_KEY),
        lambda: cluster.post("/v1/responses", chained),
    ]
    stopped = cluster.instances[holder].proc
    stopped.send_signal(signal.SIGSTOP)  # silent: its heartbeats stop, the router drops it
    try:
        cluster.wait_for(lambda: holder not in cluster.live_ids(), "the drop", 30)
        assert len(cluster.live_ids()) == 1  # a replica the request could have gone to
        for request in about:
            started = time.monotonic()
            reply = request()
            assert time.monotonic() - started >= HOLDER_WAIT_MS / 1000  # it waited first
            assert reply.status_code == 503, reply.text
            error = reply.json()["error"]
            assert error["type"] == "instance_unavailable" and rid in error["message"]
            assert int(reply.headers["Retry-After"]) >= 1
        # An id the registry never recorded is still the replicas' own 404.
        unknown = cluster.get(f"/v1/responses/resp_{'0' * 32}", key=CLIENT_KEY)
        assert unknown.status_code == 404, unknown.text
    finally:
        stopped.send_signal(signal.SIGCONT)
    cluster.wait_for(lambda: holder in cluster.serving_ids(), "the instance to be back", 30)
    for request in about:
        reply = request()
        assert reply.status_code == 200, reply.text
        assert reply.headers["x-pantheon-instance"] == holder


def test_a_stored_responses_request_waits_for_its_instance_to_come_back(cluster):
    """An instance killed and restarted is back within seconds: a request about one of its
    stored responses sent meanwhile waits for it (PANTHEON_HOLDER_WAIT_MS) and is answered
    there, not refused."""
    respond = {"model": SMOLLM2_NAME, "temperature": 0, "max_output_tokens": 4}
    made = cluster.post("/v1/responses", {**respond, "input": "Hello"})
    assert made.status_code == 200, made.text
    rid, holder = made.json()["id"], made.headers["x-pantheon-instance"]
    stopped = cluster.instances[holder].proc
    stopped.send_signal(signal.SIGSTOP)
    try:
        cluster.wait_for(lambda: holder not in cluster.live_ids(), "the drop", 30)
        # Back after a quarter of the wait: its next heartbeat makes it live again.
        threading.Timer(HOLDER_WAIT_MS / 4000, stopped.send_signal, (signal.SIGCONT,)).start()
        reply = cluster.get(f"/v1/responses/{rid}", key=CLIENT_KEY)
    finally:
        stopped.send_signal(signal.SIGCONT)
    assert reply.status_code == 200, reply.text
    assert reply.headers["x-pantheon-instance"] == holder and reply.json()["id"] == rid


def test_the_router_logs_a_forwarded_requests_route(cluster):
    reply = cluster.post("/v1/chat/completions", {"messages": QUESTION, "max_tokens": 2})
    assert reply.status_code == 200, reply.text
    assert cluster.get("/api/tags", key=CLIENT_KEY).status_code == 200
    log = cluster.tmp / "router" / f"daphne-{cluster.started_routers}.log"
    wanted = {
        ("forwarded:/v1/chat/completions", 200),
        ("forwarded:/api/tags", 200),
        ("forwarded:/v1/responses/<str:response_id>", 503),  # the test before
        ("forwarded:/v1/responses/<str:response_id>/input_items", 503),
        ("forwarded:/v1/responses/<str:response_id>/input_items", 200),
    }

    def logged() -> set[tuple[str, int]]:
        lines = [json.loads(line) for line in log.read_text().splitlines() if line[:1] == "{"]
        return {(line["route"], line["status"]) for line in lines}

    cluster.wait_for(lambda: wanted <= logged(), f"{wanted} in the router's access log", 10)
    assert ("unmatched", 200) not in logged()


def test_an_instance_failing_before_its_status_line_with_none_left_is_502(cluster):
    """Last: it leaves no instance serving."""
    victim, other = sorted(cluster.live_ids())
    stopped = cluster.instances[other].proc
    stopped.send_signal(signal.SIGSTOP)
    try:
        cluster.wait_for(lambda: other not in cluster.live_ids(), "the drop", 30)
        with concurrent.futures.ThreadPoolExecutor(1) as pool:
            long_json = {**LONG_JSON, "logit_bias": cluster.never_end}
            unanswered = pool.submit(
                cluster.post, "/v1/chat/completions", {"model": SMOLLM2_NAME, **long_json}
            )
            cluster.wait_for(lambda: cluster.running(victim) >= 1, "the request to run", 60)
            cluster.sigkill(victim)
            reply = unanswered.result(30)
        assert reply.status_code == 502, reply.text
        assert reply.json()["error"]["type"] == "instance_failed"
    finally:
        stopped.send_signal(signal.SIGCONT)
