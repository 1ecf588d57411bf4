"""GET /session/watch over a real Daphne: a held watch keeps a session past the idle TTL;
once the watch socket closes, the session goes after the grace period.

The server runs with a 1.5 s idle TTL, a 1.5 s watch grace and room for one watch; the
engine reaps idle sessions once a second.
"""

from __future__ import annotations

import socket
import time
from urllib.parse import urlsplit

import httpx
import pytest

from tests.e2e.daphne_server import Server, running_server

MODEL = "smollm2-135m-instruct"
TTL_S = 1.5
GRACE_S = 1.5
REAP_S = 1.0  # engine.serving.loop.SESSION_REAP_S
PAST_TTL_S = TTL_S + REAP_S + 1.5
HELLO = [{"role": "user", "content": "Hi"}]

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def server(tmp_path_factory, smollm2_path):
    env = {
        "PN_SESSION_IDLE_TTL_MS": str(int(TTL_S * 1000)),
        "PN_SESSION_WATCH_GRACE_MS": str(int(GRACE_S * 1000)),
        "PANTHEON_MAX_WATCHES": "1",
    }
    data_dir = tmp_path_factory.mktemp("pantheon-watch")
    with running_server(data_dir, {MODEL: smollm2_path}, **env) as srv:
        yield srv


def start_session(server: Server, session_id: str) -> None:
    body = {"messages": HELLO, "max_tokens": 2, "session_id": session_id}
    response = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text


def export(server: Server, session_id: str) -> httpx.Response:
    return httpx.post(
        server.url + "/admin/session/export", json={"session_id": session_id}, timeout=30
    )


class RawWatch:
    """GET /session/watch on a plain socket: the status line, the headers and the first
    comment are read; the connection then stays open until close()."""

    def __init__(self, server: Server, query: str):
        url = urlsplit(server.url)
        self.sock = socket.create_connection((url.hostname, url.port), timeout=30)
        request = f"GET /session/watch?{query} HTTP/1.1\r\nHost: {url.netloc}\r\n\r\n"
        self.sock.sendall(request.encode())
        self.received = b""
        head = self.read_until(b"\r\n\r\n")
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        self.status = int(status_line.split()[1])
        self.headers = {}
        for line in header_lines:
            name, _, value = line.partition(":")
            self.headers[name.strip().lower()] = value.strip()

    def read_until(self, marker: bytes) -> bytes:
        while marker not in self.received:
            chunk = self.sock.recv(65536)
            if not chunk:
                raise AssertionError(f"closed before {marker!r}: {self.received!r}")
            self.received += chunk
        found, _, self.received = self.received.partition(marker)
        return found

    def close(self) -> None:
        self.sock.close()


def test_a_held_watch_keeps_the_session_past_the_ttl_and_its_close_releases_it(server):
    start_session(server, "watched")
    watch = RawWatch(server, "session_id=watched")
    try:
        assert watch.status == 200
        assert watch.headers["content-type"] == "text/event-stream"
        assert watch.headers["cache-control"] == "no-cache"
        assert watch.headers["access-control-allow-origin"] == "*"
        watch.read_until(b": watch established\n\n")

        time.sleep(PAST_TTL_S)  # idle well past the TTL, but watched
        exported = export(server, "watched")
        assert exported.status_code == 200, exported.text
        assert exported.json()["n_tok"] > 0

        # PANTHEON_MAX_WATCHES=1: the table is full.
        second = httpx.get(
            server.url + "/session/watch",
            params={"session_id": "another"},
            timeout=10,
        )
        assert second.status_code == 503
        assert second.json()["error"]["type"] == "watch_unavailable"
        assert second.headers["access-control-allow-origin"] == "*"
    finally:
        watch.close()

    time.sleep(GRACE_S + REAP_S + 1.5)
    gone = export(server, "watched")
    assert gone.status_code == 404, gone.text
    assert gone.json()["error"]["type"] == "session_not_found"

    # The closed watch freed its place in the table.
    again = RawWatch(server, "session_id=watched")
    try:
        assert again.status == 200
    finally:
        again.close()


def test_an_unwatched_session_is_gone_after_the_ttl(server):
    start_session(server, "unwatched")
    assert export(server, "unwatched").status_code == 200
    time.sleep(PAST_TTL_S)
    gone = export(server, "unwatched")
    assert gone.status_code == 404, gone.text
    assert gone.json()["error"]["type"] == "session_not_found"


def test_the_watch_route_refuses_without_a_session_id(server):
    response = httpx.get(server.url + "/session/watch", timeout=10)
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"
    assert response.headers["connection"] == "close"
    # Other paths still reach Django: its JSON 404, the session routes.
    assert httpx.get(server.url + "/session/watch/", timeout=10).status_code == 404
    estimate = httpx.get(server.url + "/session/estimate", params={"tokens": 10}, timeout=10)
    assert estimate.status_code == 200 and estimate.json()["model"] == MODEL
