"""Parked sessions survive a SIGKILL of the real server (defect 9a of the hostile probe):
each conversation is written to the data dir in the background as its turn parks it, so a
kill (no drain, no spill) loses at most a session's last turn. After the restart every
turn 2 resumes from all of its turn 1 (`cached_tokens` = its history) and answers as a
cold run does; each session comes back under the key that made it, and stays out of the
other key's reach. The real SmolLM2 over a real Daphne."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
import pytest

from engine.serving.session_key import SessionKey
from sessions.persistence import SUFFIX, file_stem, model_folder
from tests.conftest import SMOLLM2_NAME
from tests.e2e.daphne_server import Server, running_server

pytestmark = pytest.mark.timeout(600)

CLIENT_KEY, ADMIN_KEY = "durable-client-key", "durable-admin-key"
NAMESPACE = {CLIENT_KEY: "env:client", ADMIN_KEY: "env:admin"}
FOLLOW_UP = {"role": "user", "content": "Say it again in one word."}
# (key, session id, system prompt): two sessions per key (each key's default cap of the
# four slots), one id held by both keys.
SESSIONS = [
    (CLIENT_KEY, "shared-id", "You are a concise assistant."),
    (CLIENT_KEY, "client-only", "You are a pirate."),
    (ADMIN_KEY, "shared-id", "You are a chef who loves soup."),
    (ADMIN_KEY, "admin-only", "You answer like a poet."),
]
QUESTION = {"role": "user", "content": "What is the capital of France?"}


def chat(srv: Server, key: str, messages: list[dict], session_id: str | None = None) -> dict:
    body = {"messages": messages, "temperature": 0, "max_tokens": 12}
    if session_id is not None:
        body["session_id"] = session_id
    headers = {"authorization": f"Bearer {key}"}
    reply = httpx.post(srv.url + "/v1/chat/completions", json=body, headers=headers, timeout=300)
    assert reply.status_code == 200, reply.text
    return reply.json()


def cached(reply: dict) -> int:
    return reply["usage"]["prompt_tokens_details"]["cached_tokens"]


def answer(reply: dict) -> str:
    return reply["choices"][0]["message"]["content"]


def wait_for_files(folder: Path, names: set[str], timeout: float = 120) -> None:
    """Until the background writer has put every file in `names` in place (a rename:
    a file that is there is whole)."""
    deadline = time.monotonic() + timeout
    while not names <= {p.name for p in folder.glob("*" + SUFFIX)}:
        assert time.monotonic() < deadline, sorted(p.name for p in folder.iterdir())
        time.sleep(0.2)


def test_parked_sessions_survive_a_sigkill(tmp_path_factory, smollm2_path):
    data = tmp_path_factory.mktemp("pantheon-durable")
    models = {SMOLLM2_NAME: smollm2_path}
    env = {"PANTHEON_API_KEY": CLIENT_KEY, "PANTHEON_ADMIN_API_KEY": ADMIN_KEY}
    folder = model_folder(data / "sessions", SMOLLM2_NAME)
    turn_2 = {}

    with running_server(data, models, **env) as srv:
        for key, sid, system in SESSIONS:
            messages = [{"role": "system", "content": system}, QUESTION]
            first = chat(srv, key, messages, sid)
            used = first["usage"]
            # The KV holds every token but a last one cut by max_tokens (never fed back).
            cut = first["choices"][0]["finish_reason"] == "length"
            history = used["prompt_tokens"] + used["completion_tokens"] - cut
            turn_2[key, sid] = (
                [*messages, {"role": "assistant", "content": answer(first)}, FOLLOW_UP],
                history,
            )
        stems = {file_stem(SessionKey(sid, NAMESPACE[key])) for key, sid, _ in SESSIONS}
        assert len(stems) == 4  # the shared id is two sessions, two files
        wait_for_files(folder, {f"{stem}-0{SUFFIX}" for stem in stems})
        srv.proc.kill()  # SIGKILL: no drain, no shutdown spill
        srv.proc.wait(30)
        assert "spilled" not in srv.log_tail()

    with running_server(data, models, **env) as srv:
        for (key, sid), (messages, history) in turn_2.items():
            resumed = chat(srv, key, messages, sid)
            assert cached(resumed) == history, (key, sid)
            cold = chat(srv, key, messages)
            assert cached(cold) == 0 and answer(resumed) == answer(cold), (key, sid)
        # Each came back under its own key: the other key's same id holds nothing of it.
        # (Every slot is held: the client frees one of its own for that probe.)
        release = httpx.post(
            srv.url + "/session/release",
            json={"session_id": "client-only"},
            headers={"authorization": f"Bearer {CLIENT_KEY}"},
            timeout=60,
        )
        assert release.status_code == 200, release.text
        messages, _ = turn_2[ADMIN_KEY, "admin-only"]
        assert cached(chat(srv, CLIENT_KEY, messages, "admin-only")) == 0
        log = srv.log_tail()
        assert "restored 4 session(s)" in log and "Traceback" not in log
