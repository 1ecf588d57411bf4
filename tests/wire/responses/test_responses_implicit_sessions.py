"""The Responses API's implicit session (a turn without a session id of the client's) is
a cache that makes no one wait, through the whole ASGI stack with the real SmolLM2: four
keys calling POST /v1/responses once each no longer lock every explicit session out
(before: 429 "retry in 30 s" for 12 h, the admin's included); `store: false` parks
nothing; deleting the response, or the session release route, frees it; it is never
written to disk."""

from __future__ import annotations

import pytest

from tests.access.helpers import ADMIN_KEY, bearer, console_key, in_db
from tests.access.helpers import call as _call
from tests.conftest import SMOLLM2_NAME

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.anyio]

RESPONSES = "/v1/responses"
IMPLICIT = "pantheon-responses"


@pytest.fixture
def app(served, settings):
    from django.core.asgi import get_asgi_application

    from access import keys
    from pantheon_site import stack

    settings.PANTHEON_ADMIN_API_KEY = ADMIN_KEY
    keys.forget_cache()
    yield stack.build(get_asgi_application())
    keys.forget_cache()


@pytest.fixture
def svc(served):
    return served.services()[SMOLLM2_NAME]


async def call(app, method: str, path: str, **kwargs):
    return await _call(app, method, path, timeout=300, **kwargs)


def ask(text: str, **fields) -> dict:
    return {"input": text, "temperature": 0, "max_output_tokens": 2, **fields}


def held(svc) -> set[tuple[str, str, bool]]:
    """(namespace, session id, implicit) of every session the model holds."""
    return {(i.namespace, i.session_id.id, i.implicit) for i in svc.session_info()}


async def keys(n: int, scopes: list[str]) -> list[str]:
    return [await in_db(console_key, f"probe-{i}", scopes) for i in range(n)]


async def respond(app, key: str, body: dict) -> dict:
    reply = await call(app, "POST", RESPONSES, body=body, headers=bearer(key))
    assert reply.status == 200, reply.body
    return reply.json()


async def test_four_keys_responses_leave_every_explicit_session_a_slot(app, svc):
    probes = await keys(4, ["inference"])
    for n, key in enumerate(probes):  # the probe: once each, inference-only keys
        await respond(app, key, ask(f"Say {n}."))
    assert [implicit for *_, implicit in held(svc)] == [True] * 4  # every slot
    # An explicit session afterwards gets its slot at once (was 429 for 12 hours).
    chat = {
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 1,
        "session_id": "admin-work",
    }
    reply = await call(app, "POST", "/v1/chat/completions", body=chat, headers=bearer(ADMIN_KEY))
    assert reply.status == 200, reply.body
    # ...and so do the probing keys' own explicit ones: implicit sessions are evicted,
    # least recently used first, until only explicit ones are left.
    for n, key in enumerate(probes[:3]):
        await respond(app, key, ask("Hi", prompt_cache_key=f"mine-{n}"))
    assert {(ns, sid) for ns, sid, implicit in held(svc) if not implicit} == {
        ("env:admin", "admin-work"),
        *((f"key:{k}", f"mine-{n}") for n, k in enumerate(await key_ids(probes[:3]))),
    }
    assert not [s for s in held(svc) if s[2]]
    # Four explicit sessions: a fifth is the model's own limit, as it always was.
    refused = await call(
        app,
        "POST",
        RESPONSES,
        body=ask("Hi", prompt_cache_key="one-too-many"),
        headers=bearer(probes[3]),
    )
    refused.error(429, "model_at_session_capacity")
    # With no slot left for it, an implicit session is not refused: it runs uncached.
    body = await respond(app, probes[3], ask("Say 3."))
    assert body["usage"]["input_tokens_details"]["cached_tokens"] == 0
    assert not [s for s in held(svc) if s[2]]


async def key_ids(secrets: list[str]) -> list[int]:
    """The console key ids (their namespaces are key:<id>) of these secrets."""
    from access import keys as access_keys
    from access.models import ApiKey

    def ids():
        return [ApiKey.objects.get(key_hash=access_keys.digest(s)).pk for s in secrets]

    return await in_db(ids)


async def test_store_false_without_a_session_id_parks_nothing(app, svc):
    [key] = await keys(1, ["inference"])
    body = await respond(app, key, ask("Say 1.", store=False))
    assert body["store"] is False
    assert held(svc) == set()
    # A session id of the client's is kept to all the same.
    await respond(app, key, ask("Say 1.", store=False, prompt_cache_key="mine"))
    [(_, sid, implicit)] = held(svc)
    assert (sid, implicit) == ("mine", False)


async def test_deleting_its_last_response_frees_the_implicit_session(app, svc):
    [key] = await keys(1, ["inference"])  # an inference-only key: no session routes
    first = await respond(app, key, ask("Say 1."))
    second = await respond(app, key, ask("Say 2."))
    assert [(sid, implicit) for _, sid, implicit in held(svc)] == [(IMPLICIT, True)]
    # Another stored response of the key still names the session: it is kept.
    (await call(app, "DELETE", f"{RESPONSES}/{first['id']}", headers=bearer(key))).json()
    assert len(held(svc)) == 1
    gone = await call(app, "DELETE", f"{RESPONSES}/{second['id']}", headers=bearer(key))
    assert gone.json()["deleted"] is True
    assert held(svc) == set()


async def test_deleting_a_response_leaves_an_explicit_session_alone(app, svc):
    [key] = await keys(1, ["inference"])
    body = await respond(app, key, ask("Say 1.", prompt_cache_key="mine"))
    await call(app, "DELETE", f"{RESPONSES}/{body['id']}", headers=bearer(key))
    assert [(sid, implicit) for _, sid, implicit in held(svc)] == [("mine", False)]


async def test_the_release_route_frees_an_implicit_session_for_its_owner_only(app, svc):
    owner, other = await keys(2, ["inference", "sessions"])
    await respond(app, owner, ask("Say 1."))
    release = {"session_id": IMPLICIT}
    reply = await call(app, "POST", "/session/release", body=release, headers=bearer(other))
    assert reply.status == 200 and len(held(svc)) == 1  # another key's: untouched
    reply = await call(app, "POST", "/session/release", body=release, headers=bearer(owner))
    assert reply.status == 200 and held(svc) == set()


async def test_implicit_sessions_are_never_written_to_disk(app, svc, tmp_path):
    from sessions.persistence import spill

    [key] = await keys(1, ["inference"])
    await respond(app, key, ask("Say 1."))
    await respond(app, key, ask("Say 1.", prompt_cache_key="mine"))
    assert {implicit for *_, implicit in held(svc)} == {True, False}
    counts = await in_db(spill, svc, tmp_path / "spill")
    assert [(k.id, n) for k, n in counts.items()] == [("mine", 1)]
    assert len(list((tmp_path / "spill").iterdir())) == 1
