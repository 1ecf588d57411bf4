"""The per-key session cap on a real Daphne server with one key (PANTHEON_API_KEY alone):
the only key may use every session slot. The default cap (half the slots) is for a server
where more than one key could hold sessions (sessions/tenancy.py); before, a single-user
server could never use more than half of its slots (the third of four ids was a 429)."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.daphne_server import running_server

MODEL = "smollm2-135m-instruct"
KEY = "only-key"

pytestmark = pytest.mark.timeout(300)


def test_the_only_key_of_a_server_uses_every_session_slot(tmp_path, smollm2_path):
    env = {"PANTHEON_API_KEY": KEY, "PANTHEON_MAX_SESSIONS": "4"}
    with running_server(tmp_path, {MODEL: smollm2_path}, **env) as srv:
        headers = {"authorization": f"Bearer {KEY}"}
        with httpx.Client(base_url=srv.url, headers=headers, timeout=120) as client:
            for i in range(4):
                body = {
                    "messages": [{"role": "user", "content": f"Say {i}."}],
                    "max_tokens": 1,
                    "session_id": f"only-{i}",
                }
                reply = client.post("/v1/chat/completions", json=body)
                assert reply.status_code == 200, reply.text
            body["session_id"] = "only-4"  # the fifth: the model's own limit, not the key's
            refused = client.post("/v1/chat/completions", json=body)
            assert refused.status_code == 429, refused.text
            error = refused.json()["error"]
            assert error["type"] == "model_at_session_capacity"
            assert "all 4 session slots" in error["message"], error
