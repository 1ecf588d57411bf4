"""The prefix cache as shipped (PANTHEON_PREFIX_CACHE=1, the default) on a real Daphne
server with two keys: a request repeating a prompt of the same key reports the reused
tokens in cached_tokens and answers as it did cold; the other key's identical prompt
reuses nothing of the first key's (both the OpenAI and the Anthropic usage say so)."""

from __future__ import annotations

import httpx
import pytest

from tests.e2e.daphne_server import running_server

MODEL = "smollm2-135m-instruct"
CLIENT, ADMIN = "client-key-prefix", "admin-key-prefix"
PROMPT = [{"role": "user", "content": "Name three rivers in Europe."}]

pytestmark = pytest.mark.timeout(300)


def chat(client: httpx.Client, key: str) -> dict:
    body = {"messages": PROMPT, "max_tokens": 12, "temperature": 0}
    reply = client.post(
        "/v1/chat/completions", json=body, headers={"authorization": f"Bearer {key}"}
    )
    assert reply.status_code == 200, reply.text
    return reply.json()


def test_a_key_reuses_its_own_prompt_and_never_another_key_s(tmp_path, smollm2_path):
    env = {
        "PANTHEON_PREFIX_CACHE": "1",
        "PANTHEON_API_KEY": CLIENT,
        "PANTHEON_ADMIN_API_KEY": ADMIN,
    }
    with running_server(tmp_path, {MODEL: smollm2_path}, **env) as srv:
        with httpx.Client(base_url=srv.url, timeout=120) as client:
            cold = chat(client, CLIENT)
            prompt_tokens = cold["usage"]["prompt_tokens"]
            assert cold["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
            warm = chat(client, CLIENT)
            assert warm["usage"]["prompt_tokens_details"]["cached_tokens"] == prompt_tokens - 1
            assert warm["choices"][0]["message"] == cold["choices"][0]["message"]

            other = chat(client, ADMIN)  # the same prompt, another namespace
            assert other["usage"]["prompt_tokens_details"]["cached_tokens"] == 0
            assert other["choices"][0]["message"] == cold["choices"][0]["message"]

            # Anthropic's usage splits the prompt: cache reads and the rest.
            body = {"model": MODEL, "max_tokens": 12, "messages": PROMPT, "temperature": 0}
            message = client.post("/v1/messages", json=body, headers={"x-api-key": CLIENT})
            assert message.status_code == 200, message.text
            usage = message.json()["usage"]
            assert usage["cache_read_input_tokens"] > 0
            assert usage["input_tokens"] + usage["cache_read_input_tokens"] > 0
