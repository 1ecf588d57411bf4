"""The hostile probe on a real Daphne server: four API keys calling POST /v1/responses
once each (inference-only keys, one with `store: false`) used to fill the default four
session slots with the Responses API's implicit session for 12 h, and every explicit
session_id afterwards, the admin's included, got 429 "retry in 30 s". Now implicit
sessions are evicted first and the explicit one is served at once."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

from tests.e2e.daphne_server import REPO_ROOT, running_server

MODEL = "smollm2-135m-instruct"
ADMIN_KEY = "lockout-admin-key"

pytestmark = pytest.mark.timeout(300)


def console_keys(data_dir, n: int) -> list[str]:
    """`n` inference-only console keys, written to the server's database as the console
    does (one Django start for all of them)."""
    code = (
        "from tests.access.helpers import console_key;"
        f"[print(console_key(f'probe-{{i}}', ['inference'])) for i in range({n})]"
    )
    env = {**os.environ, "PANTHEON_DATA_DIR": str(data_dir)}
    env["DJANGO_SETTINGS_MODULE"] = "pantheon_site.settings"
    out = subprocess.run(
        [sys.executable, "manage.py", "shell", "-c", code],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return out.stdout.strip().splitlines()[-n:]


def test_four_keys_responses_no_longer_lock_explicit_sessions_out(tmp_path, smollm2_path):
    env = {
        "PANTHEON_ADMIN_API_KEY": ADMIN_KEY,
        "PANTHEON_MAX_SESSIONS": "4",
        "PANTHEON_RESPONSES_IMPLICIT_TTL_S": "120",
    }
    with running_server(tmp_path, {MODEL: smollm2_path}, **env) as srv:
        probes = console_keys(tmp_path, 5)
        with httpx.Client(base_url=srv.url, timeout=120) as client:
            for n, key in enumerate(probes):
                body = {"input": f"Say {n}.", "max_output_tokens": 2, "temperature": 0}
                if n == 4:
                    body["store"] = False  # parks nothing at all
                reply = client.post(
                    "/v1/responses", json=body, headers={"authorization": f"Bearer {key}"}
                )
                assert reply.status_code == 200, reply.text
            admin = {"authorization": f"Bearer {ADMIN_KEY}"}
            for n in range(2):  # the admin's cap: half of the four slots
                chat = {
                    "messages": [{"role": "user", "content": "Hi"}],
                    "max_tokens": 1,
                    "session_id": f"admin-work-{n}",
                }
                reply = client.post("/v1/chat/completions", json=chat, headers=admin)
                assert reply.status_code == 200, reply.text
            # An explicit session through the Responses API itself, for a probing key.
            mine = {"input": "Hi", "max_output_tokens": 2, "prompt_cache_key": "mine"}
            reply = client.post(
                "/v1/responses", json=mine, headers={"authorization": f"Bearer {probes[0]}"}
            )
            assert reply.status_code == 200, reply.text
            config = client.get("/admin/config", headers=admin).json()["settings"]
            ttl = config["responses_implicit_ttl_s"]
            assert ttl["value"] == 120 and ttl["mutable"] is False
            assert ttl["env"] == "PANTHEON_RESPONSES_IMPLICIT_TTL_S"
