"""GET /metrics and GET /admin/stats after real requests on the real SmolLM2, through every
ASGI layer (the access log is what records them)."""

from __future__ import annotations

from contextlib import aclosing

import pytest

from tests.access.asgi_raw import request, stack_app
from tests.conftest import SMOLLM2_NAME as MODEL
from tests.observability.helpers import (
    ADMIN_KEY,
    CLIENT_KEY,
    bearer,
    moved,
    scrape,
    sse_usage,
    stats,
    stats_moved,
)

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.anyio]

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "Say hello."}]


@pytest.fixture
def keys(settings):
    """A client key (inference) and an admin key (every scope, metrics included)."""
    from access import keys

    settings.PANTHEON_API_KEY = CLIENT_KEY
    settings.PANTHEON_ADMIN_API_KEY = ADMIN_KEY
    keys.forget_cache()
    yield
    keys.forget_cache()


@pytest.fixture
def one_slot(served, smollm2_service):
    """SmolLM2 again as "busy": one slot and no queue, so a second request is a 429."""
    from engine.types import ModelConfig

    config = ModelConfig(
        name="busy", path=smollm2_service.path, max_concurrent=1, queue_depth=0, ctx_cap=256
    )
    svc = smollm2_service.sibling(config)
    served.register("busy", svc)
    yield svc
    served.unregister("busy")
    svc.close()


async def hold_the_slot(svc):
    """A generation admitted on `svc`'s only slot (the engine, not HTTP: it is not one of
    the requests the test counts); closing it frees the slot."""
    from engine.types import GenerationRequest, SamplingParams

    ids = svc.encode_chat(HELLO)
    params = SamplingParams(temperature=0, max_tokens=1000)
    gen = svc.generate(GenerationRequest("hold", tuple(ids), params))
    await anext(gen)
    return gen


async def test_counters_and_histograms_move_by_exactly_the_requests_made(keys, served, one_slot):
    app = stack_app()
    client, admin = bearer(CLIENT_KEY), bearer(ADMIN_KEY)
    before, stats_before = await scrape(app), await stats(app)

    # Chat, a session's first turn, then its second streamed (its prompt is cached).
    body = {"model": MODEL, "messages": HELLO, "max_tokens": 4, "temperature": 0}
    first = await request(app, "POST", CHAT, body, headers={**client, "x-session-id": "m1"})
    assert first.status == 200, first.body
    said = first.json()["choices"][0]["message"]["content"]
    turn2 = [*HELLO, {"role": "assistant", "content": said}, {"role": "user", "content": "Again."}]
    body = {
        "model": MODEL,
        "messages": turn2,
        "max_tokens": 4,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    second = await request(app, "POST", CHAT, body, headers={**client, "x-session-id": "m1"})
    assert second.status == 200, second.body
    completion = await request(
        app,
        "POST",
        "/v1/completions",
        {"model": MODEL, "prompt": "Once upon a time", "max_tokens": 3, "temperature": 0},
        headers=admin,
    )
    assert completion.status == 200, completion.body
    anthropic = await request(
        app,
        "POST",
        "/v1/messages",
        {"model": MODEL, "messages": HELLO, "max_tokens": 3, "temperature": 0},
        headers={"x-api-key": CLIENT_KEY},
    )
    assert anthropic.status == 200, anthropic.body
    ollama = await request(
        app,
        "POST",
        "/api/generate",
        {"model": MODEL, "prompt": "Hi", "stream": False, "options": {"num_predict": 2}},
        headers=client,
    )
    assert ollama.status == 200, ollama.body
    responses = await request(
        app,
        "POST",
        "/v1/responses",
        {"model": MODEL, "input": "Hi", "max_output_tokens": 2, "temperature": 0},
        headers=client,
    )
    assert responses.status == 200, responses.body
    # Refused: a malformed body (400) and a full model (429 server_busy).
    bad = await request(app, "POST", CHAT, {"model": MODEL, "messages": "no"}, headers=client)
    assert bad.status == 400, bad.body
    held = await hold_the_slot(one_slot)
    async with aclosing(held):
        body = {"model": "busy", "messages": HELLO, "max_tokens": 2}
        busy = await request(app, "POST", CHAT, body, headers=client)
    assert busy.status == 429 and busy.json()["error"]["type"] == "server_busy", busy.body

    after, stats_after = await scrape(app), await stats(app)

    # What the responses reported, as (prompt, cached prompt, generated) tokens. Ollama's
    # answer does not say how much of its prompt came from a cache (None): the engine may
    # reuse a prefix another request left in a slot.
    u1, u2 = first.json()["usage"], sse_usage(second.body)
    u3, u4 = completion.json()["usage"], anthropic.json()["usage"]
    u5, u6 = ollama.json(), responses.json()["usage"]
    reported = {
        "chat": (u1["prompt_tokens"], u1["prompt_tokens_details"]["cached_tokens"],
                 u1["completion_tokens"]),
        "stream": (u2["prompt_tokens"], u2["prompt_tokens_details"]["cached_tokens"],
                   u2["completion_tokens"]),
        "completion": (u3["prompt_tokens"], 0, u3["completion_tokens"]),
        "anthropic": (u4["input_tokens"] + u4["cache_read_input_tokens"],
                      u4["cache_read_input_tokens"], u4["output_tokens"]),
        "ollama": (u5["prompt_eval_count"], None, u5["eval_count"]),
        "responses": (u6["input_tokens"], u6["input_tokens_details"]["cached_tokens"],
                      u6["output_tokens"]),
    }  # fmt: skip
    assert reported["stream"][1] > 0, "the second turn resumed from the session's cache"
    prompt, generated = (sum(t[i] for t in reported.values()) for i in (0, 2))
    cached = sum(t[1] for t in reported.values() if t[1] is not None)

    assert moved(before, after, "pantheon_requests_total", route=CHAT, status="200") == 2
    assert moved(before, after, "pantheon_requests_total", route=CHAT, status="400") == 1
    assert moved(before, after, "pantheon_requests_total", route=CHAT, status="429") == 1
    for route in ("/v1/completions", "/v1/messages", "/api/generate", "/v1/responses"):
        assert moved(before, after, "pantheon_requests_total", route=route, status="200") == 1
    assert moved(before, after, "pantheon_rejections_total", reason="server_busy") == 1
    assert moved(before, after, "pantheon_prompt_tokens_total", model=MODEL) == prompt
    ollama_cached = (
        moved(before, after, "pantheon_cached_prompt_tokens_total", model=MODEL) - cached
    )
    assert 0 <= ollama_cached <= reported["ollama"][0]
    assert moved(before, after, "pantheon_generated_tokens_total", model=MODEL) == generated
    for name in ("prompt_tokens", "cached_prompt_tokens", "generated_tokens"):
        assert moved(before, after, f"pantheon_{name}_total", model="busy") == 0  # refused
    # Each generation observed once (per choice for the time per output token).
    generations = len(reported)
    for name in ("time_to_first_token", "request_duration", "queue_wait"):
        count = f"pantheon_{name}_seconds_count"
        assert moved(before, after, count, model=MODEL) == generations, name
        assert moved(before, after, count, model="busy") == 0, name
        assert moved(before, after, f"pantheon_{name}_seconds_sum", model=MODEL) > 0, name
    decoded = sum(t[2] > 1 for t in reported.values())
    count = "pantheon_time_per_output_token_seconds_count"
    assert moved(before, after, count, model=MODEL) == decoded

    # The usage stats: the same requests summed by key and model.
    by_client = [reported[name] for name in ("chat", "stream", "anthropic", "ollama", "responses")]
    assert stats_moved(stats_before, stats_after) == {
        ("env:client", MODEL): {
            "requests": 5,
            "prompt_tokens": sum(t[0] for t in by_client),
            "cached_tokens": sum(t[1] or 0 for t in by_client) + ollama_cached,
            "completion_tokens": sum(t[2] for t in by_client),
            "errors": 0,
        },
        ("env:admin", MODEL): {
            "requests": 1,
            "prompt_tokens": reported["completion"][0],
            "cached_tokens": 0,
            "completion_tokens": reported["completion"][2],
            "errors": 0,
        },
        # Refused before a model was resolved, and refused by the full model.
        ("env:client", ""): {"requests": 1, "errors": 1, **_no_tokens()},
        ("env:client", "busy"): {"requests": 1, "errors": 1, **_no_tokens()},
    }


def _no_tokens() -> dict:
    return {"prompt_tokens": 0, "cached_tokens": 0, "completion_tokens": 0}


async def test_gauges_describe_the_served_models(served, one_slot):
    app = stack_app()
    held = await hold_the_slot(one_slot)
    async with aclosing(held):
        during = await scrape(app, key=None)
    after = await scrape(app, key=None)
    gauge = lambda s, name, **labels: s[(name, frozenset(labels.items()))]  # noqa: E731
    assert gauge(during, "pantheon_models_loaded") == 2
    assert gauge(during, "pantheon_slots_total", model="busy") == 1
    assert gauge(during, "pantheon_slots_busy", model="busy") == 1
    assert gauge(during, "pantheon_requests_running", model="busy") == 1
    assert gauge(during, "pantheon_requests_waiting", model="busy") == 0
    assert gauge(during, "pantheon_kv_tokens_used", model="busy") > 0
    assert gauge(during, "pantheon_kv_tokens_capacity", model="busy") == 256
    assert gauge(during, "pantheon_weight_bytes", model=MODEL) > 0
    assert gauge(during, "pantheon_prefix_cache_slots_kept", model="busy") == 0  # suite: off
    assert gauge(during, "pantheon_prefix_cache_host_bytes", model="busy") == 0
    assert gauge(during, "pantheon_memory_ladder_rung") == 0
    assert gauge(after, "pantheon_slots_busy", model="busy") == 0
    assert gauge(after, "pantheon_requests_running", model="busy") == 0
    assert gauge(after, "pantheon_kv_tokens_used", model="busy") == 0
