"""Sessions survive a graceful restart of the real server: SIGTERM spills them to the data
dir, the next start restores them before the model is served, and turn 2 resumes from
turn 1's KV as if the server had never stopped. A spill file that fails validation is
moved aside; the server starts and serves all the same. The real SmolLM2."""

from __future__ import annotations

import signal
import sqlite3
import time
from pathlib import Path

import httpx
import pytest

from sessions.persistence import REJECTED_DIR, SUFFIX, file_stem, model_folder
from tests.conftest import SMOLLM2_NAME
from tests.e2e.daphne_server import Server, running_server

pytestmark = pytest.mark.timeout(600)

SESSION = "restart-session"
TURN_1 = [
    {"role": "system", "content": "You are a concise assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]
FOLLOW_UP = {"role": "user", "content": "And of Germany?"}


def chat(srv: Server, messages: list[dict], **extra) -> dict:
    body = {"messages": messages, "temperature": 0, "max_tokens": 16, **extra}
    response = httpx.post(srv.url + "/v1/chat/completions", json=body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def cached(reply: dict) -> int:
    return reply["usage"]["prompt_tokens_details"]["cached_tokens"]


def answer(reply: dict) -> str:
    return reply["choices"][0]["message"]["content"]


def stop_gracefully(srv: Server) -> None:
    srv.proc.send_signal(signal.SIGTERM)
    assert srv.proc.wait(60) == 0, srv.log_tail()


def rows(data: Path) -> dict[str, str]:
    """{session id: state} of the console's session records."""
    with sqlite3.connect(data / "pantheon.sqlite3") as db:
        return dict(db.execute("SELECT session_id, state FROM pantheon_sessions_sessionrecord"))


def test_a_session_survives_a_graceful_restart(tmp_path_factory, smollm2_path):
    data = tmp_path_factory.mktemp("pantheon-data")
    models = {SMOLLM2_NAME: smollm2_path}
    folder = model_folder(data / "sessions", SMOLLM2_NAME)

    with running_server(data, models) as srv:
        first = chat(srv, TURN_1, session_id=SESSION)
        assert first["choices"][0]["finish_reason"] == "stop"  # its last token is held too
        stop_gracefully(srv)
        assert "spilled 1 session(s)" in srv.log_tail()

    spilled = sorted(p.name for p in folder.iterdir())
    assert spilled == [f"{file_stem(SESSION)}-0{SUFFIX}"]  # one file, named by hash
    assert rows(data) == {SESSION: "spilled"}
    garbage = f"{'f' * 24}-0{SUFFIX}"
    (folder / garbage).write_bytes(b"PNKVBLOB but nothing else of a blob")

    with running_server(data, models) as srv:
        turn_2 = [*TURN_1, {"role": "assistant", "content": answer(first)}, FOLLOW_UP]
        second = chat(srv, turn_2, session_id=SESSION)
        used = first["usage"]
        assert cached(second) == used["prompt_tokens"] + used["completion_tokens"]
        cold = chat(srv, turn_2)
        assert cached(cold) == 0 and answer(second) == answer(cold)

        # The garbage file was moved aside with its reason; the good one is in memory, and
        # stays on disk (a kill now would still find it).
        assert sorted(p.name for p in folder.glob("*" + SUFFIX)) == spilled
        assert (folder / REJECTED_DIR / garbage).is_file()
        reason = (folder / REJECTED_DIR / f"{garbage}.reason.txt").read_text()
        assert "BadSessionBlob" in reason
        log = srv.log_tail()
        assert f"session file {garbage} not restored" in log and SMOLLM2_NAME in log
        assert "Traceback" not in log

        deadline = time.monotonic() + 10  # the mirror thread turns the row live again
        while rows(data) != {SESSION: "live"}:
            assert time.monotonic() < deadline, rows(data)
            time.sleep(0.2)
