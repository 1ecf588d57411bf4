"""Crash safety of the real server: SIGKILL (no drain, no spill, no clean-up) in the middle
of a model load and in the middle of a session spill, then a restart on the same data
dir. Everything acknowledged before the kill (a 200 from an operator route, a session
spilled by an acknowledged unload) is served again; what the kill interrupted is absent
or whole, never half-there; the database passes SQLite's integrity check. The real
SmolLM2.

Two test hooks (settings.PANTHEON_TEST_*_DELAY_MS, no effect when unset) hold the
interrupted write open long enough to land the kill inside it deterministically: a load
between its weights being in memory and its database record, a spill between a file's
fsynced temp copy and its rename.
"""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from sessions.persistence import REJECTED_DIR, SUFFIX, TEMP_MARK, model_folder
from tests.e2e.daphne_server import REPO_ROOT, Server, running_server

pytestmark = pytest.mark.timeout(300)

HI = [{"role": "user", "content": "What is the capital of France?"}]
TURN_1 = [
    {"role": "system", "content": "You are a concise assistant."},
    {"role": "user", "content": "What is the capital of France?"},
]
FOLLOW_UP = {"role": "user", "content": "And of Germany?"}


@pytest.fixture(scope="module")
def weight_cache(tmp_path_factory) -> str:
    """One weight cache for every server here: only the first start prepares weights."""
    return str(tmp_path_factory.mktemp("weight-cache"))


def post(srv: Server, path: str, body: dict, timeout: float = 60) -> httpx.Response:
    return httpx.post(srv.url + path, json=body, timeout=timeout)


def chat(srv: Server, model: str, messages: list[dict], **extra) -> dict:
    body = {"model": model, "messages": messages, "temperature": 0, "max_tokens": 16, **extra}
    response = post(srv, "/v1/chat/completions", body, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()


def cached(reply: dict) -> int:
    return reply["usage"]["prompt_tokens_details"]["cached_tokens"]


def answer(reply: dict) -> str:
    return reply["choices"][0]["message"]["content"]


def kill_when(srv: Server, ready, what: str, timeout: float = 60) -> None:
    """SIGKILL the daphne process itself (running_server starts it without a shell) as
    soon as `ready()` is true."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert srv.proc.poll() is None, f"the server exited before {what}:\n{srv.log_tail()}"
        assert time.monotonic() < deadline, f"never saw {what}:\n{srv.log_tail()}"
        time.sleep(0.01)
    srv.proc.kill()
    assert srv.proc.wait(10) == -signal.SIGKILL


def database(data: Path) -> sqlite3.Connection:
    db = sqlite3.connect(data / "pantheon.sqlite3")
    assert db.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    return db


def model_rows(data: Path) -> dict[str, tuple[int, int]]:
    """{name: (should_load, pinned)} of the operator's model table."""
    with database(data) as db:
        rows = db.execute("SELECT name, should_load, pinned FROM operators_servedmodel")
        return {name: (should_load, pinned) for name, should_load, pinned in rows}


def test_a_kill_during_a_model_load_loses_only_that_load(
    tmp_path_factory, smollm2_path, weight_cache
):
    data = tmp_path_factory.mktemp("pantheon-data")
    seed = {"smollm2": smollm2_path}
    # The hook holds every load of this server for 3 s, the start-up one too; the kill
    # lands the moment the second load starts its hold.
    hold = {"PANTHEON_WEIGHT_CACHE_DIR": weight_cache, "PANTHEON_TEST_LOAD_DELAY_MS": "3000"}

    with running_server(data, seed, **hold) as srv:
        alias = post(srv, "/admin/aliases", {"alias": "gpt-4o", "target": "smollm2"})
        assert alias.status_code == 200, alias.text
        pin = post(srv, "/admin/models/pin", {"name": "smollm2", "pinned": True})
        assert pin.status_code == 200, pin.text

        outcome: list[object] = []
        body = {"path": smollm2_path.name, "name": "second"}
        loader = threading.Thread(
            target=lambda: outcome.append(_try(post, srv, "/admin/models/load", body)),
            daemon=True,
        )
        loader.start()
        # The weights of "second" are in memory and its record is not yet written.
        kill_when(srv, lambda: "holding the load of second" in srv.log_tail(), "the load")
        loader.join(30)
        assert outcome and isinstance(outcome[0], httpx.TransportError), outcome

    # Acknowledged: the model, its pin and the alias; the interrupted load left no row.
    assert model_rows(data) == {"smollm2": (1, 1)}
    with database(data) as db:
        assert db.execute("SELECT alias, target FROM operators_alias").fetchall() == [
            ("gpt-4o", "smollm2")
        ]

    with running_server(data, seed, PANTHEON_WEIGHT_CACHE_DIR=weight_cache) as srv:
        health = httpx.get(srv.url + "/").json()
        assert health["models"] == {"smollm2": "loaded"}
        served = [m["id"] for m in httpx.get(srv.url + "/v1/models").json()["data"]]
        assert served == ["smollm2"]
        reply = chat(srv, "gpt-4o", HI)
        assert reply["model"] == "smollm2" and "Paris" in answer(reply)
        row = httpx.get(srv.url + "/admin/models").json()["data"][0]
        assert row["id"] == "smollm2" and row["pinned"] is True and row["aliases"] == ["gpt-4o"]

        # The interrupted name loads now like any new one.
        load = post(srv, "/admin/models/load", {"path": smollm2_path.name, "name": "second"})
        assert load.status_code == 200, load.text
        assert answer(chat(srv, "second", HI)) == answer(reply)
        assert "Traceback" not in srv.log_tail()
    assert model_rows(data) == {"smollm2": (1, 1), "second": (1, 0)}


def test_a_kill_during_a_session_spill_keeps_the_acknowledged_spill(
    tmp_path_factory, smollm2_path, weight_cache
):
    data = tmp_path_factory.mktemp("pantheon-data")
    seed = {"alpha": smollm2_path, "beta": smollm2_path}
    alpha = model_folder(data / "sessions", "alpha")
    beta = model_folder(data / "sessions", "beta")
    env = {"PANTHEON_WEIGHT_CACHE_DIR": weight_cache}

    with running_server(data, seed, PANTHEON_TEST_SPILL_DELAY_MS="2000", **env) as srv:
        first = chat(srv, "alpha", TURN_1, session_id="acked")
        # The unload answers once alpha's sessions are on disk: that spill is acknowledged.
        unload = post(srv, "/admin/models/unload", {"name": "alpha"})
        assert unload.status_code == 200, unload.text
        acked_files = sorted(p.name for p in alpha.glob("*" + SUFFIX))
        assert len(acked_files) == 1

        beta_first = chat(srv, "beta", TURN_1, session_id="interrupted")
        # The background writer puts beta's session on disk as its turn parks it.
        deadline = time.monotonic() + 60
        while not list(beta.glob("*" + SUFFIX)):
            assert time.monotonic() < deadline, "beta's session was not written"
            time.sleep(0.1)
        # A graceful stop spills beta's session again; the kill lands inside that write.
        srv.proc.send_signal(signal.SIGTERM)
        kill_when(srv, lambda: _temp_files(beta), "the spill's temp file")

    # The interrupted rewrite left its temp file; the background copy is whole.
    stale = _temp_files(beta)
    assert stale and len(list(beta.glob("*" + SUFFIX))) == 1
    assert model_rows(data) == {"alpha": (0, 0), "beta": (1, 0)}

    with running_server(data, seed, wait_for=["beta"], **env) as srv:
        assert httpx.get(srv.url + "/").json()["models"] == {"beta": "loaded"}
        # The interrupted write was removed at beta's load, never tried as a session.
        assert not any(p.exists() for p in stale)
        load = post(srv, "/admin/models/load", {"path": smollm2_path.name, "name": "alpha"})
        assert load.status_code == 200, load.text

        turn_2 = [*TURN_1, {"role": "assistant", "content": answer(first)}, FOLLOW_UP]
        resumed = chat(srv, "alpha", turn_2, session_id="acked")
        used = first["usage"]
        assert cached(resumed) == used["prompt_tokens"] + used["completion_tokens"]
        cold = chat(srv, "alpha", turn_2)
        assert cached(cold) == 0 and answer(resumed) == answer(cold)
        # The killed spill lost nothing: the background copy resumes beta's session.
        used = beta_first["usage"]
        resumed_beta = chat(srv, "beta", turn_2, session_id="interrupted")
        assert cached(resumed_beta) == used["prompt_tokens"] + used["completion_tokens"]

        assert not (alpha / REJECTED_DIR).exists() and not (beta / REJECTED_DIR).exists()
        # Restored, and kept on disk: a kill now would still find it.
        assert sorted(p.name for p in alpha.glob("*" + SUFFIX)) == acked_files
        log = srv.log_tail()
        assert "left by an interrupted session spill" in log
        assert "Traceback" not in log


def test_an_empty_secret_key_left_by_a_killed_first_start_is_replaced(tmp_path):
    (tmp_path / "secret_key").touch()  # created, killed before the key was written
    code = "import pantheon_site.settings as s; print(s.SECRET_KEY)"
    env = {**os.environ, "PANTHEON_DATA_DIR": str(tmp_path)}
    env.pop("PANTHEON_SECRET_KEY", None)
    run = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, run.stderr
    key = (tmp_path / "secret_key").read_text()
    assert len(key) > 40 and run.stdout.strip() == key
    assert sorted(p.name for p in tmp_path.iterdir()) == ["secret_key"]  # no temp file


def _temp_files(folder: Path) -> list[Path]:
    return [p for p in folder.glob(".*") if TEMP_MARK in p.name] if folder.is_dir() else []


def _try(fn, *args):
    try:
        return fn(*args)
    except Exception as exc:  # the server died under the request
        return exc
