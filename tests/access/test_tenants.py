"""Each API key's sessions are its own (defect 3 of the hostile probe): a second key that
knows a session id can neither resume it (`cached_tokens`), release it, overwrite it with
a forged blob, watch it, read it through an estimate, export it, nor take every session
slot or watch from the first key.

Through the whole ASGI stack (pantheon_site.stack: the real access guard, Django views,
the Channels watch consumer) with two console keys and the real SmolLM2 (a sibling of the
session's service: four session slots, four watches). Plus the session table's own
namespace bookkeeping.
"""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json

import numpy as np
import pytest

from engine.serving.session_blob import SessionSnapshot, encode
from engine.serving.session_blob_read import read_header
from engine.serving.session_key import OPEN, SessionKey
from engine.serving.sessions import Conversation, SessionTable
from engine.types import SessionCapacity, WatchUnavailable
from tests.access.asgi_raw import request
from tests.access.helpers import bearer, call, console_key, in_db
from tests.conftest import SMOLLM2_NAME
from tests.support import asgi_scope

CLIENT_SCOPES = ["inference", "sessions"]
CHAT, RELEASE, RESTORE = "/v1/chat/completions", "/session/release", "/session/restore"
EXPORT, ESTIMATE = "/admin/session/export", "/session/estimate"

SECRET = [
    {"role": "system", "content": "The vault PIN is 4821 and the password is swordfish."},
    {"role": "user", "content": "What is the capital of France?"},
]
FOLLOW_UP = {"role": "user", "content": "And of Germany?"}
OTHER = [{"role": "user", "content": "Write one word about the sea."}]


# --- the session table: namespaces and per-key caps --------------------------------------


def _conv(*tokens: int) -> Conversation:
    shape = (1, 1, len(tokens), 2)
    return Conversation(tokens, np.zeros(shape, np.float32), np.zeros(shape, np.float32))


def test_a_key_is_an_id_in_a_namespace_and_a_plain_str_is_the_open_one():
    a, b = SessionKey("s", "key:1"), SessionKey("s", "key:2")
    assert a != b and a != "s" and "s" != a and hash(a) != hash(b)
    assert SessionKey("s") == "s" and hash(SessionKey("s", OPEN)) == hash("s")
    assert SessionKey.of("s").namespace == OPEN and SessionKey.of(a) is a
    assert str(a) == "s" == a.id and json.dumps(a) == '"s"'
    assert len({a, b, SessionKey("s", "key:1"), "s"}) == 3


def test_the_same_id_under_two_keys_is_two_sessions():
    table = SessionTable(4)
    a, b = SessionKey("s", "key:a"), SessionKey("s", "key:b")
    table.begin_turn(a)
    table.park(a, _conv(1, 2, 3, 4), table.match(a, (1, 2, 3, 4)))
    table.end_turn(a)
    assert table.match(b, (1, 2, 3, 4, 5)).cached == 0  # nothing of a's shows under b
    assert table.match("s", (1, 2, 3, 4, 5)).cached == 0  # nor in the open namespace
    assert table.release(b) is False and table.match(a, (1, 2, 3, 4, 5)).cached == 4
    assert table.owners("s") == [a] and table.info()[0].namespace == "key:a"


def test_a_key_holds_at_most_half_the_slots_and_watches_the_open_namespace_all():
    table = SessionTable(4, max_watches=4)
    for i in range(2):
        table.begin_turn(SessionKey(f"b{i}", "key:b"))
    with pytest.raises(SessionCapacity, match="this API key holds 2"):
        table.begin_turn(SessionKey("b2", "key:b"))
    assert not table.would_admit(SessionKey("b2", "key:b"))
    for i in range(2):
        table.begin_turn(SessionKey(f"a{i}", "key:a"))  # a still gets its share
    for i in range(2):
        table.watch(SessionKey(f"w{i}", "key:b"))
    with pytest.raises(WatchUnavailable, match="this API key holds 2"):
        table.watch(SessionKey("w2", "key:b"))
    table.watch(SessionKey("w", "key:a"))

    open_table = SessionTable(4, max_watches=4)  # a server with no key: today's limits
    for i in range(4):
        open_table.begin_turn(f"s{i}")
        open_table.watch(f"s{i}")
    assert SessionTable(4, key_max_sessions=3).key_max_sessions == 3


def _table(several: bool, **caps) -> SessionTable:
    table = SessionTable(4, max_watches=4, **caps)
    table.several_keys = lambda: several  # what sessions.tenancy answers on a server
    return table


def test_the_only_key_of_a_server_may_use_every_slot_and_watch():
    table = _table(False)  # one key could hold sessions: the default caps do not apply
    for i in range(4):
        table.begin_turn(SessionKey(f"a{i}", "env:client"))
        table.watch(SessionKey(f"a{i}", "env:client"))
    with pytest.raises(SessionCapacity, match="all 4 session slots"):  # the table's own
        table.begin_turn(SessionKey("a4", "env:client"))


def test_with_two_keys_each_holds_half_the_slots_and_watches():
    table = _table(True)
    for i in range(2):
        table.begin_turn(SessionKey(f"s{i}", "key:a"))
        table.watch(SessionKey(f"s{i}", "key:a"))
    with pytest.raises(SessionCapacity, match="this API key holds 2"):
        table.begin_turn(SessionKey("s2", "key:a"))
    with pytest.raises(WatchUnavailable, match="this API key holds 2"):
        table.watch(SessionKey("s2", "key:a"))
    for i in range(2):  # the other key's half is still there
        table.begin_turn(SessionKey(f"s{i}", "key:b"))
        table.watch(SessionKey(f"s{i}", "key:b"))


def test_a_cap_set_explicitly_applies_even_to_the_only_key():
    table = _table(False, key_max_sessions=3, key_max_watches=1)
    for i in range(3):
        table.begin_turn(SessionKey(f"a{i}", "key:1"))
    with pytest.raises(SessionCapacity, match=r"this API key holds 3 .*\(3 of"):
        table.begin_turn(SessionKey("a3", "key:1"))
    table.watch(SessionKey("a0", "key:1"))
    with pytest.raises(WatchUnavailable, match="this API key holds 1"):
        table.watch(SessionKey("a1", "key:1"))


def test_keys_at_their_watch_cap_cannot_fill_the_watch_table():
    """Issue 36 9a: two keys at the cap filled the 64-watch table (503 for the rest). The
    cap is the table's share per key that could hold watches."""
    table = SessionTable(64, max_watches=64)
    table.several_keys = lambda: True
    table.key_holders = lambda: 3
    for name in ("a", "b"):
        for i in range(64):
            try:
                table.watch(SessionKey(f"w{i}", f"key:{name}"))
            except WatchUnavailable as refused:
                assert "this API key holds 21" in str(refused)
                break
    for i in range(21):  # the third key still gets its whole share
        table.watch(SessionKey(f"w{i}", "key:c"))
    with pytest.raises(WatchUnavailable, match=r"this API key holds 21 .*\(21 of the model's 64\)"):
        table.watch(SessionKey("w21", "key:c"))


def test_an_explicit_watch_cap_is_held_to_the_tables_share():
    table = SessionTable(4, max_watches=64, key_max_watches=40)
    table.key_holders = lambda: 2
    for i in range(32):
        table.watch(SessionKey(f"w{i}", "key:a"))
    with pytest.raises(WatchUnavailable, match="this API key holds 32"):
        table.watch(SessionKey("w32", "key:a"))
    table.key_holders = lambda: 1  # the only key: its explicit cap
    for i in range(32, 40):
        table.watch(SessionKey(f"w{i}", "key:a"))
    with pytest.raises(WatchUnavailable, match="this API key holds 40"):
        table.watch(SessionKey("w40", "key:a"))


def test_an_answer_that_cannot_be_had_keeps_the_caps():
    table = SessionTable(4)
    table.several_keys = lambda: 1 / 0
    for i in range(2):
        table.begin_turn(SessionKey(f"a{i}", "key:1"))
    assert not table.would_admit(SessionKey("a2", "key:1"))


# --- how many keys could hold sessions (sessions.tenancy) --------------------------------


@pytest.fixture
def counted():
    """tenancy's count of console keys, fresh for the test and forgotten after it."""
    from sessions import tenancy

    tenancy.forget()
    yield tenancy
    tenancy.forget()


def test_several_keys_counts_the_keys_that_could_hold_sessions(counted, settings):
    settings.PANTHEON_API_KEY = settings.PANTHEON_ADMIN_API_KEY = ""
    counted.refresh()
    assert counted.several_keys() is False  # an open server
    console_key("export-only", ["session_export"])  # holds no session: not counted
    assert counted.several_keys() is False
    one = console_key("one", ["inference"])  # saved: counted again at once (the signal)
    assert counted.several_keys() is False
    settings.PANTHEON_API_KEY = "pk-env-client"
    assert counted.several_keys() is True  # the env key and a console key
    settings.PANTHEON_API_KEY = ""
    console_key("two", ["sessions"])
    assert counted.several_keys() is True  # two console keys

    from access import keys
    from access.models import ApiKey

    assert counted.key_holders() == 2
    console_key("three", ["inference"])
    assert counted.key_holders() == 3  # every key counted: the watch table's share

    ApiKey.objects.filter(key_hash=keys.digest(one)).get().delete()
    ApiKey.objects.filter(name="three").delete()
    assert counted.several_keys() is False
    settings.PANTHEON_API_KEY = "pk-env-client"
    settings.PANTHEON_ADMIN_API_KEY = "pk-env-admin"  # two env keys, whatever the database
    assert counted.several_keys() is True


def test_an_unknown_count_keeps_the_caps(counted, settings):
    settings.PANTHEON_API_KEY = "pk-env-client"
    settings.PANTHEON_ADMIN_API_KEY = ""
    assert counted.several_keys() is True  # nothing counted yet (a count starts behind)


# --- over the ASGI stack, with two console keys ------------------------------------------


pytestmark = pytest.mark.django_db(transaction=True)
anyio = pytest.mark.anyio


@pytest.fixture
def svc(empty_runtime, smollm2_service):
    """A fresh SmolLM2 (four session slots, four watches: two each per key) served as the
    only model."""
    config = dataclasses.replace(
        smollm2_service.config, name=SMOLLM2_NAME, max_sessions=4, max_watches=4
    )
    fresh = smollm2_service.sibling(config)
    from sessions import tenancy

    tenancy.forget()
    tenancy.attach(fresh.sessions)  # as the load hook does (sessions.persistence)
    empty_runtime.register(SMOLLM2_NAME, fresh)
    yield fresh
    fresh.close()
    tenancy.forget()


@pytest.fixture
def app(svc):
    from django.core.asgi import get_asgi_application

    from access import keys
    from pantheon_site import stack

    keys.forget_cache()
    yield stack.build(get_asgi_application())
    keys.forget_cache()


@pytest.fixture
def keys_ab(db):
    """(A, B, operator): two client keys and an operator key with session_export."""
    return (
        console_key("tenant-a", CLIENT_SCOPES),
        console_key("tenant-b", CLIENT_SCOPES),
        console_key("operator", ["session_export"]),
    )


def ns(key: str) -> str:
    """The namespace the guard gives a console key."""
    from access import keys
    from access.models import ApiKey

    return f"key:{ApiKey.objects.get(key_hash=keys.digest(key)).pk}"


async def chat(app, key: str, messages: list[dict], session_id: str | None = None) -> dict:
    body = {"messages": messages, "temperature": 0, "max_tokens": 8}
    if session_id is not None:
        body["session_id"] = session_id
    reply = await call(app, "POST", CHAT, body=body, headers=bearer(key), timeout=300)
    assert reply.status == 200, reply.body[:500]
    return reply.json()


def cached(reply: dict) -> int:
    return reply["usage"]["prompt_tokens_details"]["cached_tokens"]


def answer(reply: dict) -> str:
    return reply["choices"][0]["message"]["content"]


def history(reply: dict) -> int:
    return reply["usage"]["prompt_tokens"] + reply["usage"]["completion_tokens"]


def turn_2(first: dict) -> list[dict]:
    return [*SECRET, {"role": "assistant", "content": answer(first)}, FOLLOW_UP]


@anyio
async def test_another_key_cannot_resume_observe_or_release_a_session(app, svc, keys_ab):
    a, b, _ = keys_ab
    first = await chat(app, a, SECRET, "victim")

    # B sends A's prompts under A's id: every token is computed again, for B. (B releases
    # its own session of the id after each probe, so each one starts from nothing of B's.)
    wrong_pin = {**SECRET[0], "content": SECRET[0]["content"].replace("4821", "0000")}
    for probe in (turn_2(first), SECRET, [wrong_pin, SECRET[1]]):
        assert cached(await chat(app, b, probe, "victim")) == 0
        body = {"session_id": "victim"}
        released = await call(app, "POST", RELEASE, body=body, headers=bearer(b))
        assert released.status == 200 and released.json()["released"] is True

    # The estimate takes no session: what B reads there is the same with or without A's id.
    query = "tokens=100&blob_bytes=1000"
    plain = await request(app, "GET", ESTIMATE, query=query, headers=bearer(b))
    named = await request(
        app, "GET", ESTIMATE, query=f"{query}&session_id=victim", headers=bearer(b)
    )
    assert plain.status == named.status == 200 and plain.json() == named.json()

    # B cannot export at all (no session_export scope).
    refused = await call(app, "POST", EXPORT, body={"session_id": "victim"}, headers=bearer(b))
    refused.error(403, "insufficient_scope")

    # A's own turn 2 still resumes from all of turn 1, and answers as a cold run does.
    second = await chat(app, a, turn_2(first), "victim")
    assert cached(second) == history(first)
    await asyncio.to_thread(lambda: svc.clear_prefix_cache().result(30))  # A's own, kept
    cold = await chat(app, a, turn_2(first))
    assert cached(cold) == 0 and answer(second) == answer(cold)


@anyio
async def test_another_key_cannot_overwrite_a_session_with_a_forged_blob(app, svc, keys_ab):
    a, b, _ = keys_ab
    first = await chat(app, a, SECRET, "victim")
    # What the probe did: A's exact history (learned through cached_tokens) with KV of its
    # own making, sent as a restore under A's id. The format is public; the KV is noise.
    (tokens,) = [c.tokens for _, c, _, _ in svc.sessions.conversations()]
    n_layer, n_kv_head, head_dim = svc.kv.layout
    noise = np.random.default_rng(0).standard_normal(
        (n_layer, n_kv_head, len(tokens), head_dim), dtype=np.float32
    )
    blob = encode(SessionSnapshot(svc.kv_layout, tokens, noise * 8, noise * 8, "victim"))
    forged = {
        "session_id": "victim",
        "blob": base64.b64encode(blob).decode(),
        "tokens": list(tokens),
    }
    restored = await call(app, "POST", RESTORE, body=forged, headers=bearer(b))
    assert restored.status == 200, restored.body[:300]  # into B's own session of the id

    # A's turn 2 resumes from A's own KV: the answer a cold run gives, not noise.
    second = await chat(app, a, turn_2(first), "victim")
    cold = await chat(app, a, turn_2(first))
    assert cached(second) == history(first) and answer(second) == answer(cold)


@anyio
async def test_an_operator_exports_any_key_s_session_and_is_told_whose(app, svc, keys_ab):
    a, b, operator = keys_ab
    await chat(app, a, SECRET, "shared-id")
    one = await call(
        app, "POST", EXPORT, body={"session_id": "shared-id"}, headers=bearer(operator)
    )
    assert one.status == 200 and one.json()["namespace"] == await in_db(ns, a)
    blob = base64.b64decode(one.json()["blob_b64"])
    assert read_header(blob)["namespace"] == one.json()["namespace"]  # the blob says so too

    await chat(app, b, OTHER, "shared-id")  # now two keys hold the id
    both = await call(
        app, "POST", EXPORT, body={"session_id": "shared-id"}, headers=bearer(operator)
    )
    assert "namespace" in both.error(400, "invalid_request_error")
    named = {"session_id": "shared-id", "namespace": await in_db(ns, b)}
    chosen = await call(app, "POST", EXPORT, body=named, headers=bearer(operator))
    assert chosen.status == 200 and chosen.json()["namespace"] == named["namespace"]
    assert chosen.json()["tokens"] != one.json()["tokens"]


@anyio
async def test_one_key_filling_its_slots_leaves_the_other_key_its_share(app, svc, keys_ab):
    a, b, _ = keys_ab
    for i in range(2):
        await chat(app, b, OTHER, f"b-{i}")
    for i in range(2, 4):  # B's next new ids: its own cap, not the model's
        body = {"messages": OTHER, "max_tokens": 1, "session_id": f"b-{i}"}
        reply = await call(app, "POST", CHAT, body=body, headers=bearer(b), timeout=300)
        assert "this API key holds 2" in reply.error(429, "model_at_session_capacity")
        assert reply.headers["retry-after"]
    for i in range(2):  # A's new ids are served, with their sessions
        await chat(app, a, SECRET, f"a-{i}")
    assert cached(await chat(app, a, turn_2(await chat(app, a, SECRET, "a-0")), "a-0")) > 0


class Watch:
    """GET /session/watch through the whole stack with a key; the client hangs up on
    `close()`."""

    def __init__(self, app, key: str, session_id: str):
        self.scope = {
            **asgi_scope("GET", "/session/watch"),
            "query_string": f"session_id={session_id}".encode(),
            "headers": [
                (b"host", b"127.0.0.1:8000"),
                *[(k.encode(), v.encode()) for k, v in bearer(key).items()],
            ],
            "server": ("127.0.0.1", 8000),
        }
        self.app, self.status, self.body = app, 0, b""
        self.started, self.gone = asyncio.Event(), asyncio.Event()
        self.task: asyncio.Task | None = None

    async def _receive(self):
        if not hasattr(self, "_asked"):
            self._asked = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await self.gone.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message):
        if message["type"] == "http.response.start":
            self.status = message["status"]
        else:
            self.body += message.get("body", b"")
            self.started.set()

    async def open(self) -> Watch:
        self.task = asyncio.create_task(self.app(self.scope, self._receive, self._send))
        await asyncio.wait_for(self.started.wait(), 30)
        return self

    async def close(self) -> None:
        self.gone.set()
        await asyncio.wait_for(self.task, 30)


@anyio
async def test_another_key_cannot_watch_a_session_nor_take_every_watch(app, svc, keys_ab):
    a, b, _ = keys_ab
    await chat(app, a, SECRET, "victim")
    victim = SessionKey("victim", await in_db(ns, a))
    watches = [await Watch(app, b, "victim").open(), await Watch(app, b, "other").open()]
    try:
        assert [w.status for w in watches] == [200, 200]
        assert svc.sessions.watches(victim) == 0  # B's hold is on B's own id
        third = await Watch(app, b, "third").open()
        await asyncio.wait_for(third.task, 30)
        assert third.status == 503 and b"this API key holds 2" in third.body
        mine = await Watch(app, a, "victim").open()  # A still gets its share
        assert mine.status == 200 and svc.sessions.watches(victim) == 1
        await mine.close()
    finally:
        for w in watches:
            await w.close()


@anyio
async def test_the_only_key_uses_every_slot_until_a_second_key_is_made(app, svc, db):
    a = await in_db(console_key, "alone", CLIENT_SCOPES)
    for i in range(4):  # the only key: all four slots, not half of them
        await chat(app, a, OTHER, f"a-{i}")
    for i in range(4):
        body = {"session_id": f"a-{i}"}
        released = await call(app, "POST", RELEASE, body=body, headers=bearer(a))
        assert released.status == 200 and released.json()["released"] is True

    await in_db(console_key, "second", CLIENT_SCOPES)  # now two keys: half each
    for i in range(2):
        await chat(app, a, OTHER, f"a-{i}")
    body = {"messages": OTHER, "max_tokens": 1, "session_id": "a-2"}
    reply = await call(app, "POST", CHAT, body=body, headers=bearer(a), timeout=300)
    assert "this API key holds 2" in reply.error(429, "model_at_session_capacity")
