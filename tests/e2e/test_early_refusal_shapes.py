"""Refusals Daphne's hook writes before the ASGI app (pantheon_site/daphne_hooks.py: a
wrong key, a forbidden Origin, once the headers are in) come in the error shape of the
route's wire format, as the ASGI layers' own do (tests/access/test_wire_shapes.py): issue
36 item 9, where a real server answered /v1/messages and /api/* in the generic shape."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.daphne_server import running_server

KEY = "early-key"

pytestmark = pytest.mark.timeout(300)


def test_early_refusals_speak_each_routes_format(tmp_path):
    with running_server(tmp_path, {}, PANTHEON_API_KEY=KEY) as srv:
        with httpx.Client(base_url=srv.url, timeout=30) as client:
            wrong = {"authorization": "Bearer not-the-key"}
            anthropic = client.post("/v1/messages", json={}, headers=wrong)
            assert anthropic.status_code == 401, anthropic.text
            body = anthropic.json()
            assert body["type"] == "error" and body["error"]["type"] == "authentication_error"
            assert "API key" in body["error"]["message"]

            ollama = client.post("/api/chat", json={}, headers=wrong)
            assert ollama.status_code == 401, ollama.text
            assert set(ollama.json()) == {"error"} and "API key" in ollama.json()["error"]

            elsewhere = client.post("/v1/chat/completions", json={}, headers=wrong)
            assert elsewhere.status_code == 401
            assert elsewhere.json()["error"]["type"] == "invalid_api_key"

            evil = {"authorization": f"Bearer {KEY}", "origin": "http://evil.example"}
            forbidden = client.post("/v1/messages", json={}, headers=evil)
            assert forbidden.status_code == 403, forbidden.text
            assert forbidden.json()["error"]["type"] == "permission_error"
            assert forbidden.json()["type"] == "error"

            forbidden = client.post("/api/generate", json={}, headers=evil)
            assert forbidden.status_code == 403, forbidden.text
            assert set(forbidden.json()) == {"error"}
            assert "Origin" in forbidden.json()["error"]


def test_the_client_libraries_read_the_refusals(tmp_path):
    """Through the unmodified clients (issue 35 item 5): the ollama client's ResponseError
    carries a string (not a dict) for a wrong key and no key (on a POST and on GET
    /api/tags) and for a browser Origin on a POST; the anthropic SDK raises its AuthenticationError and
    PermissionDeniedError with Anthropic's error types."""
    anthropic = pytest.importorskip("anthropic")
    ollama = pytest.importorskip("ollama")
    with running_server(tmp_path, {}, PANTHEON_API_KEY=KEY) as srv:
        evil = {"Authorization": f"Bearer {KEY}", "Origin": "http://evil.example"}
        refusals = {
            401: [{"Authorization": "Bearer not-the-key"}, {}],
            403: [evil],
        }
        for status, header_sets in refusals.items():
            for headers in header_sets:
                client = ollama.Client(host=srv.url, headers=headers)
                chat = lambda: client.chat(model="m", messages=[{"role": "user", "content": "hi"}])  # noqa: E731,B023
                # A foreign Origin may read (GET): only state-changing requests are refused.
                for ask in (chat, client.list) if status == 401 else (chat,):
                    with pytest.raises(ollama.ResponseError) as refused:
                        ask()
                    assert refused.value.status_code == status
                    assert isinstance(refused.value.error, str) and refused.value.error

        hello = dict(model="m", max_tokens=8, messages=[{"role": "user", "content": "hi"}])
        wrong = anthropic.Anthropic(base_url=srv.url, api_key="not-the-key", max_retries=0)
        with pytest.raises(anthropic.AuthenticationError) as refused:
            wrong.messages.create(**hello)
        assert refused.value.body["error"]["type"] == "authentication_error"
        browser = anthropic.Anthropic(
            base_url=srv.url,
            api_key=KEY,
            max_retries=0,
            default_headers={"Origin": "http://evil.example"},
        )
        with pytest.raises(anthropic.PermissionDeniedError) as refused:
            browser.messages.create(**hello)
        assert refused.value.body["error"]["type"] == "permission_error"
