"""Bounded Responses storage: every free-form text of the request has a bound (400 naming
the field, before any work), and stored responses are capped per record, per key (count
and bytes, the oldest evicted first) and by age, each key's apart from the others', all
reported in /admin/stats. Through the whole ASGI stack with the real SmolLM2, as
test_responses.py; the caps' arithmetic also on wire.responses.storage directly."""

from __future__ import annotations

import time
from datetime import timedelta

import pytest

from tests.access.helpers import bearer, console_key, in_db
from tests.wire.responses.test_responses import RESPONSES, app, call, events_of, greedy
from wire.fields import TEXT_MAX

__all__ = ["app"]  # the fixture, imported for these tests

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.anyio]

LONG = "x" * (TEXT_MAX + 1)


def _call_item(**fields) -> dict:
    return {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}", **fields}


def _tool(**fields) -> dict:
    return {"type": "function", "name": "f", "parameters": {"type": "object"}, **fields}


def _format(**fields) -> dict:
    return {"format": {"type": "json_schema", "name": "x", "schema": {}, **fields}}


TOO_LONG = [
    ({"input": LONG}, "input"),
    ({"input": [{"role": "user", "content": LONG}]}, "input[0].content"),
    (
        {"input": [{"role": "user", "content": [{"type": "input_text", "text": LONG}]}]},
        "input[0].content[0].text",
    ),
    ({"input": [_call_item(arguments=LONG)]}, "input[0].arguments"),
    ({"input": [_call_item(name="n" * 257)]}, "input[0].name"),
    ({"input": [_call_item(call_id="c" * 257)]}, "input[0].call_id"),
    (
        {
            "input": [
                _call_item(),
                {"type": "function_call_output", "call_id": "c1", "output": LONG},
            ]
        },
        "input[1].output",
    ),
    (
        {"input": [{"type": "reasoning", "content": [{"type": "reasoning_text", "text": LONG}]}]},
        "input[0].content[0].text",
    ),
    ({"input": "hi", "instructions": LONG}, "instructions"),
    ({"input": "hi", "text": _format(description=LONG)}, "text.format.description"),
    ({"input": "hi", "text": _format(name="n" * 65)}, "text.format.name"),
    ({"input": "hi", "tools": [_tool(description=LONG)]}, "tools[0].description"),
    ({"input": "hi", "tools": [_tool(name="n" * 65)]}, "tools[0].name"),
    ({"input": "hi", "metadata": {"k": "v" * 513}}, "metadata.k"),
    ({"input": "hi", "previous_response_id": "r" * 257}, "previous_response_id"),
    ({"input": "hi", "prompt_cache_key": "k" * 257}, "prompt_cache_key"),
]


@pytest.mark.parametrize(("body", "param"), TOO_LONG, ids=[p for _, p in TOO_LONG])
async def test_a_field_over_its_bound_is_a_400_naming_it(app, body, param):
    reply = await call(app, "POST", RESPONSES, body=body)
    reply.error(400, "invalid_request_error")
    assert reply.json()["error"]["param"] == param, reply.json()


def test_text_at_the_bound_is_read():
    from wire.responses.request import parse_request

    req = parse_request({"input": "x" * TEXT_MAX, "text": _format(description="d" * TEXT_MAX)})
    assert len(req.input_messages[0]["content"]) == TEXT_MAX
    assert len(req.text_echo["format"]["description"]) == TEXT_MAX


# --- the caps, through the stack --------------------------------------------------------


async def test_a_response_over_the_item_cap_is_answered_not_stored(app, settings):
    settings.PANTHEON_RESPONSES_MAX_ITEM_BYTES = 200
    reply = await call(app, "POST", RESPONSES, body=greedy())
    assert reply.status == 200, reply.body
    body = reply.json()
    assert body["store"] is False and body["output"]
    (await call(app, "GET", f"{RESPONSES}/{body['id']}")).error(404, "invalid_request_error")
    streamed = await call(app, "POST", RESPONSES, body=greedy(stream=True))
    last = events_of(streamed.body)[-1]
    assert last["type"] in ("response.completed", "response.incomplete")
    assert last["response"]["store"] is False
    rid = last["response"]["id"]
    (await call(app, "GET", f"{RESPONSES}/{rid}")).error(404, "invalid_request_error")


async def test_past_the_count_cap_the_keys_oldest_is_evicted_not_another_keys(app, settings):
    settings.PANTHEON_RESPONSES_MAX_PER_KEY = 2
    a = await in_db(console_key, "tenant-a", ["inference"])
    b = await in_db(console_key, "tenant-b", ["inference"])
    theirs = (await call(app, "POST", RESPONSES, body=greedy(), headers=bearer(b))).json()["id"]
    ids = []
    for _ in range(3):
        reply = await call(app, "POST", RESPONSES, body=greedy(), headers=bearer(a))
        assert reply.status == 200 and reply.json()["store"] is True, reply.body
        ids.append(reply.json()["id"])
    evicted = await call(app, "GET", f"{RESPONSES}/{ids[0]}", headers=bearer(a))
    assert evicted.error(404, "invalid_request_error") == (
        f"Response with id '{ids[0]}' not found."
    )
    for rid in ids[1:]:
        assert (await call(app, "GET", f"{RESPONSES}/{rid}", headers=bearer(a))).status == 200
    assert (await call(app, "GET", f"{RESPONSES}/{theirs}", headers=bearer(b))).status == 200
    follow = await call(
        app, "POST", RESPONSES, body=greedy(previous_response_id=ids[0]), headers=bearer(a)
    )
    follow.error(404, "invalid_request_error")
    assert follow.json()["error"]["param"] == "previous_response_id"


async def test_an_expired_response_is_gone_and_stats_report_what_is_stored(app, settings):
    from wire.responses.models import StoredResponse

    admin = await in_db(console_key, "operator", ["inference", "admin"])
    first = (await call(app, "POST", RESPONSES, body=greedy(), headers=bearer(admin))).json()
    second = (await call(app, "POST", RESPONSES, body=greedy(), headers=bearer(admin))).json()
    stats = (await call(app, "GET", "/admin/stats", headers=bearer(admin))).json()
    stored = stats["stored_responses"]
    assert stored["count"] == 2 and stored["bytes"] > 0
    assert [row["count"] for row in stored["by_key"]] == [2]
    assert stored["limits"] == {
        "max_item_bytes": settings.PANTHEON_RESPONSES_MAX_ITEM_BYTES,
        "max_bytes_per_key": settings.PANTHEON_RESPONSES_MAX_BYTES_PER_KEY,
        "max_per_key": settings.PANTHEON_RESPONSES_MAX_PER_KEY,
        "ttl_s": settings.PANTHEON_RESPONSES_TTL_S,
    }

    def age(response_id):
        old = StoredResponse.objects.get(id=response_id).created - timedelta(days=31)
        StoredResponse.objects.filter(id=response_id).update(created=old)

    await in_db(age, first["id"])
    got = await call(app, "GET", f"{RESPONSES}/{first['id']}", headers=bearer(admin))
    got.error(404, "invalid_request_error")
    assert not await in_db(lambda: StoredResponse.objects.filter(id=first["id"]).exists())
    await in_db(age, second["id"])
    follow = await call(
        app,
        "POST",
        RESPONSES,
        body=greedy(previous_response_id=second["id"]),
        headers=bearer(admin),
    )
    follow.error(404, "invalid_request_error")
    assert follow.json()["error"]["param"] == "previous_response_id"
    stats = (await call(app, "GET", "/admin/stats", headers=bearer(admin))).json()
    assert stats["stored_responses"]["count"] == 0 and stats["stored_responses"]["by_key"] == []


# --- the caps' arithmetic, on storage directly -------------------------------------------


def _save(namespace: str, n: int, text: str = "hello") -> tuple[str, int]:
    from wire.responses import storage

    body = {"id": f"resp_{namespace}_{n}", "object": "response", "output": []}
    conversation = [{"role": "user", "content": text}]
    assert storage.save(body, namespace, "m", None, conversation)
    time.sleep(0.002)  # distinct creation times: "oldest" is well defined
    return body["id"], storage.record_size(conversation, body)


def _ids(namespace: str) -> set[str]:
    from wire.responses.models import StoredResponse

    return set(StoredResponse.objects.filter(namespace=namespace).values_list("id", flat=True))


@pytest.mark.django_db(transaction=False)
def test_past_the_byte_cap_the_oldest_go_first_never_the_one_just_written(settings):
    from wire.responses import storage
    from wire.responses.models import StoredResponse

    _, size = _save("other", 0)
    settings.PANTHEON_RESPONSES_MAX_BYTES_PER_KEY = 3 * size + size // 2
    ids = [_save("key:1", n)[0] for n in range(5)]
    assert _ids("key:1") == set(ids[2:])
    assert _ids("other") == {"resp_other_0"}  # another key's bytes are its own
    assert StoredResponse.objects.get(id=ids[4]).size == size
    # One record larger than the rest of the key's cap evicts every older one of the key.
    settings.PANTHEON_RESPONSES_MAX_BYTES_PER_KEY = 2 * size + 4 * 40
    big, _ = _save("key:1", 9, text="y" * (size + 4 * 40))
    assert _ids("key:1") == {big}
    # A record over the key's whole byte cap is not stored (it could only evict itself).
    body = {"id": "resp_key_1_10", "output": []}
    assert not storage.save(body, "key:1", "m", None, [{"content": "z" * (5 * size)}])
    assert _ids("key:1") == {big}


@pytest.mark.django_db(transaction=False)
def test_expired_records_are_swept_when_one_is_stored(settings, monkeypatch):
    from wire.responses import storage
    from wire.responses.models import StoredResponse

    old, _ = _save("key:1", 0)
    StoredResponse.objects.filter(id=old).update(
        created=StoredResponse.objects.get(id=old).created - timedelta(seconds=11)
    )
    settings.PANTHEON_RESPONSES_TTL_S = 10
    monkeypatch.setattr(storage, "_last_prune", time.monotonic())
    fresh, _ = _save("key:2", 1)
    assert _ids("key:1") == {old}  # a sweep ran within PRUNE_EVERY_S: none now
    monkeypatch.setattr(storage, "_last_prune", None)
    newer, _ = _save("key:2", 2)
    assert _ids("key:1") == set() and _ids("key:2") == {fresh, newer}
    assert storage.find("key:2", fresh) is not None


def test_an_anthropic_tool_description_has_the_same_bound():
    from pantheon_platform.errors import ApiError
    from wire.anthropic.request import parse_messages_request

    tool = {"name": "f", "description": LONG, "input_schema": {"type": "object"}}
    body = {"model": "m", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
    with pytest.raises(ApiError) as refused:
        parse_messages_request({**body, "tools": [tool]})
    assert refused.value.status == 400
    assert refused.value.extra["param"] == "tools.0.description"
