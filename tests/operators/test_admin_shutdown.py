"""POST /admin/shutdown on the real server: the SIGTERM drain (202 at once, new work
refused with 503, the in-flight stream finished, Daphne exits 0), and a runtime config
stored before it is what the next server on the same data dir serves with."""

from __future__ import annotations

import json
import re

import httpx
import pytest

from tests.e2e.daphne_server import Server, running_server

MODEL = "smollm2-135m-instruct"
COUNT = [{"role": "user", "content": "Count from 1 to 1000, separated by commas."}]

pytestmark = pytest.mark.timeout(600)


def content_lines(lines: list[str]) -> int:
    return sum('"content"' in line for line in lines)


def open_stream(server: Server, max_tokens: int):
    body = {"messages": COUNT, "temperature": 0, "max_tokens": max_tokens, "stream": True}
    return httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=120)


def test_shutdown_drains_like_sigterm_and_the_stored_config_outlives_it(
    tmp_path_factory, smollm2_path
):
    data_dir = tmp_path_factory.mktemp("pantheon-data")
    env = {"PANTHEON_MAX_CONCURRENT": "1", "PANTHEON_DRAIN_TIMEOUT": "240"}
    with running_server(data_dir, {MODEL: smollm2_path}, **env) as server:
        # Stored now; this server's queue takes it too (nothing waits in it).
        patched = httpx.patch(server.url + "/admin/config", json={"queue_depth": 0})
        assert patched.status_code == 200, patched.text

        lines: list[str] = []
        with open_stream(server, 24) as r:
            assert r.status_code == 200
            it = r.iter_lines()
            while content_lines(lines) < 2:
                lines.append(next(it))
            answer = httpx.post(server.url + "/admin/shutdown")
            assert answer.status_code == 202, answer.text
            body = answer.json()
            assert body["shutting_down"] is True and body["in_flight"] == 1
            assert body["drain_timeout_s"] == 240
            refused = httpx.post(
                server.url + "/v1/chat/completions", json={"messages": COUNT, "max_tokens": 1}
            )
            assert refused.status_code == 503, refused.text
            assert refused.json()["error"]["type"] == "server_shutting_down"
            again = httpx.post(server.url + "/admin/shutdown")  # already draining: the same
            assert again.status_code == 202
            lines += list(it)  # the stream goes on to its end
        data = [json.loads(x[6:]) for x in lines if x.startswith("data: {")]
        assert [x for x in lines if x][-1] == "data: [DONE]"
        assert data[-1]["choices"][0]["finish_reason"] == "length"
        assert server.proc.wait(60) == 0, server.log_tail()
        assert "POST /admin/shutdown: draining 1 in-flight requests" in server.log_tail()
        assert "drained; exiting" in server.log_tail()
        # The first start's load wrote its progress to the log, ending at 100%.
        progress = re.findall(
            rf"loading {MODEL}: (\w+) +(\d+)% \((\d+)/(\d+) tensors", server.log.read_text()
        )
        assert len(progress) >= 3 and progress[-1][1] == "100", progress
        assert progress[-1][2] == progress[-1][3]

    # The next server on the same data dir reads the stored depth back at start: with its
    # one slot busy, the next request may not wait.
    with running_server(data_dir, {MODEL: smollm2_path}, **env) as server:
        row = httpx.get(server.url + "/admin/config").json()["settings"]["queue_depth"]
        assert row["value"] == 0 and row["source"] == "database"
        lines = []
        with open_stream(server, 200) as r:
            it = r.iter_lines()
            while content_lines(lines) < 1:
                lines.append(next(it))
            busy = httpx.post(
                server.url + "/v1/chat/completions", json={"messages": COUNT, "max_tokens": 1}
            )
        assert busy.status_code == 429, busy.text
        assert busy.json()["error"]["type"] == "server_busy"


def test_outside_daphne_there_is_nothing_to_stop_and_nothing_drains(api):
    from pantheon_platform import shutdown
    from tests.operators.helpers import error_of

    message = error_of(api.post("/admin/shutdown"), 503, "shutdown_unavailable")
    assert "not a Daphne server" in message
    assert not shutdown.draining()
