"""The real SmolLM2 served under two names: the session's instance, plus the same GGUF
loaded again over HTTP (once for the module: ~5 s and ~1 GB). Both answer by name, and
unloading one mid-stream lets the stream finish before the model is freed."""

from __future__ import annotations

import asyncio
import json

import pytest
from django.test import override_settings

from pantheon_platform.runtime import Runtime
from tests.conftest import SMOLLM2_NAME
from tests.operators.helpers import Api, AsgiRequest, error_of, install

SECOND = "smollm2-second"
CHAT = "/v1/chat/completions"
PARIS = [{"role": "user", "content": "What is the capital of France?"}]
COUNT = [{"role": "user", "content": "Count from 1 to 1000, separated by commas."}]

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def two_names(smollm2_service, smollm2_path):
    rt = Runtime()
    rt.register(SMOLLM2_NAME, smollm2_service)
    with (
        pytest.MonkeyPatch.context() as mp,
        override_settings(PANTHEON_MODEL_DIRS=[smollm2_path.parent]),
    ):
        install(mp, rt)
        body = {"path": str(smollm2_path), "name": SECOND, "ctx_cap": 1024}
        response = Api().post(
            "/admin/models/load", {**body, "max_sessions": 2, "max_concurrent": 2}
        )
        assert response.status_code == 200, response.content
        yield rt, response.json()
        rt.unregister(SMOLLM2_NAME)  # the session's service: not ours to close
        rt.close()


def test_the_second_name_has_its_own_configuration(two_names, smollm2_service):
    rt, row = two_names
    served = rt.services()[SECOND]
    assert row["id"] == SECOND and row["weights_version"] == smollm2_service.weights_version
    assert (row["context_window"], row["context_window_configured"]) == (1024, 1024)
    assert row["max_concurrent_configured"] == 2
    assert row["max_concurrent"] == served.max_concurrent  # the engine's, not the request's
    # Its weights (the GGUF's ~96 MB of blocks on the compiled kernels, ~540 MB of
    # float32 on numpy) plus its own KV cache.
    assert row["host_bytes"] == served.model.weight_bytes + served.kv.nbytes
    assert row["host_bytes"] > 90_000_000

    api = Api()
    listed = {m["id"]: m for m in api.get("/v1/models").json()["data"]}
    assert set(listed) == {SMOLLM2_NAME, SECOND}
    assert listed[SECOND]["context_window"] == 1024
    assert listed[SECOND]["max_concurrent"] == served.max_concurrent
    rows = api.get("/admin/models").json()["data"]
    assert [r["id"] for r in rows] == [SMOLLM2_NAME, SECOND]


def test_both_names_answer_by_name(two_names):
    api = Api()
    answers = {}
    for name in (SMOLLM2_NAME, SECOND):
        body = {"model": name, "messages": PARIS, "temperature": 0, "max_tokens": 12}
        response = api.post(CHAT, body)
        assert response.status_code == 200, response.content
        assert response.json()["model"] == name
        answers[name] = response.json()["choices"][0]["message"]["content"]
    assert answers[SMOLLM2_NAME] == answers[SECOND] == "The capital of France is Paris."


@pytest.mark.anyio
async def test_unloading_mid_stream_lets_the_stream_finish(two_names):
    # Last in this module: it unloads the second name.
    from django.core.asgi import get_asgi_application

    rt, _ = two_names
    app = get_asgi_application()
    # Long enough to still be running while the unload waits and the refused request is
    # made, on the compiled kernels too (64 tokens took ~0.6 s there); the turn-end
    # tokens banned, so it ends by `length`.
    max_tokens = 400
    body = {"model": SECOND, "messages": COUNT, "temperature": 0, "max_tokens": max_tokens}
    body["logit_bias"] = {"0": -100, "1": -100, "2": -100}
    body |= {"stream": True, "stream_options": {"include_usage": True}}
    stream = AsgiRequest(app, "POST", CHAT, json.dumps(body).encode()).start()
    await stream.wait_for(lambda r: sum(b'"content"' in c for c in r.chunks) >= 2, timeout=120)

    unload = AsgiRequest(app, "POST", "/admin/models/unload", b'{"name": "%s"}' % SECOND.encode())
    unload.start()
    await asyncio.sleep(0.5)
    assert not unload.task.done()  # waiting for the stream
    assert not stream.task.done()
    # The name stopped routing at once; the other name still answers.
    assert set(rt.services()) == {SMOLLM2_NAME}
    refused = AsgiRequest(app, "POST", CHAT, json.dumps({**body, "stream": False}).encode())
    await asyncio.wait_for(refused.start().task, 30)
    assert refused.status == 404 and "being unloaded" in refused.json()["error"]["message"]

    await asyncio.wait_for(unload.task, 120)
    await asyncio.wait_for(stream.task, 30)
    assert (unload.status, unload.json()) == (200, {"unloaded": SECOND, "drained": True})
    events = [
        json.loads(block.removeprefix("data: "))
        for block in b"".join(stream.chunks).decode().split("\n\n")
        if block.startswith("data: {")
    ]
    assert b"".join(stream.chunks).endswith(b"data: [DONE]\n\n")
    assert [e["choices"][0]["finish_reason"] for e in events if e["choices"]][-1] == "length"
    assert events[-1]["usage"]["completion_tokens"] == max_tokens  # nothing was cut off
    assert rt.instance(SECOND) is None
    error_of(Api().post("/admin/models/unload", {"name": SECOND}), 404, "unload_failed")
