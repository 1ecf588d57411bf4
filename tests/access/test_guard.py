"""The access guard (access/guard.py) through the real ASGI stack: keys and scopes, the
DNS-rebinding, cross-origin and content-type defences, and the per-key quota."""

from __future__ import annotations

import asyncio

import pytest

from tests.access.helpers import (
    ADMIN_KEY,
    CLIENT_KEY,
    HOST,
    bearer,
    call,
    in_db,
    make_key,
)

# Transactional: the guard reads keys from a worker thread (database_sync_to_async).
pytestmark = [pytest.mark.anyio, pytest.mark.django_db(transaction=True)]

MODELS, LOAD, UNLOAD = "/v1/models", "/admin/models/load", "/admin/models/unload"
EXPORT, RELEASE, CHAT = "/admin/session/export", "/session/release", "/v1/chat/completions"
REFUSED = {401, 403, 415, 429}


# --- no key configured: the contract's open server --------------------------------------


async def test_with_no_key_configured_every_route_is_open(app, rt):
    assert (await call(app, "GET", MODELS)).status == 200
    assert (await call(app, "GET", "/admin/models")).status == 200
    # An OpenAI SDK always sends some key ("unused" in the README): it is not checked.
    assert (await call(app, "GET", MODELS, headers=bearer("unused"))).status == 200


# --- 401 -------------------------------------------------------------------------------


async def test_a_missing_key_is_401_and_says_how_to_send_one(app, rt, env_keys):
    reply = await call(app, "GET", MODELS)
    message = reply.error(401, "invalid_api_key")
    assert "Authorization: Bearer" in message and "x-api-key" in message
    assert reply.headers["www-authenticate"] == "Bearer"


@pytest.mark.parametrize(
    "headers",
    [
        {"authorization": "Bearer wrong-key"},
        {"x-api-key": "wrong-key"},
        {"authorization": f"Basic {CLIENT_KEY}"},  # not a bearer token
        {"authorization": f"Bearer {CLIENT_KEY}x"},
        {"x-api-key": "pn_not-a-console-key"},
    ],
)
async def test_a_wrong_key_is_401(app, rt, env_keys, headers):
    message = (await call(app, "GET", MODELS, headers=headers)).error(401, "invalid_api_key")
    if "Basic" not in headers.get("authorization", ""):
        assert "not valid" in message


@pytest.mark.parametrize("headers", [bearer(CLIENT_KEY), {"x-api-key": CLIENT_KEY}])
async def test_the_key_is_accepted_in_either_header(app, rt, env_keys, headers):
    assert (await call(app, "GET", MODELS, headers=headers)).status == 200
    lower_scheme = {"authorization": f"bearer {CLIENT_KEY}"}
    assert (await call(app, "GET", MODELS, headers=lower_scheme)).status == 200


async def test_get_root_stays_open_with_keys_set(app, rt, env_keys):
    reply = await call(app, "GET", "/")
    assert reply.status == 200 and reply.json()["service"] == "pantheon"


async def test_options_preflight_needs_no_key(app, rt, env_keys):
    for path in (CHAT, UNLOAD, EXPORT, "/session/watch"):
        reply = await call(app, "OPTIONS", path, headers={"origin": "http://app.example"})
        assert reply.status == 200, (path, reply.body)
        assert reply.headers["access-control-allow-origin"] == "*"


async def test_unknown_routes_and_the_watch_need_a_key(app, rt, env_keys):
    (await call(app, "GET", "/nope")).error(401, "invalid_api_key")
    (await call(app, "GET", "/session/watch")).error(401, "invalid_api_key")


# --- 403 insufficient_scope ------------------------------------------------------------


async def test_the_client_key_cannot_reach_operator_routes(app, rt, env_keys):
    for method, path, body in [
        ("GET", "/admin/models", None),
        ("POST", LOAD, {"name": "tiny", "path": "tiny.gguf"}),
        ("POST", EXPORT, {"session_id": "s"}),
    ]:
        reply = await call(app, method, path, body=body, headers=bearer(CLIENT_KEY))
        message = reply.error(403, "insufficient_scope")
        assert "PANTHEON_ADMIN_API_KEY" in message
    assert "tiny" not in rt.services()


async def test_a_key_without_admin_cannot_load_and_one_with_it_can(app, rt, env_keys):
    body = {"name": "tiny", "path": "tiny.gguf"}
    key = await make_key("chat only", ["inference", "sessions", "session_export"])
    (await call(app, "POST", LOAD, body=body, headers=bearer(key))).error(403, "insufficient_scope")
    assert "tiny" not in rt.services()
    reply = await call(app, "POST", LOAD, body=body, headers=bearer(ADMIN_KEY))
    assert reply.status == 200, reply.body
    assert "tiny" in rt.services()


async def test_a_key_without_session_export_cannot_export(app, tiny, env_keys):
    body = {"name": "tiny", "session_id": "nobody"}
    key = await make_key("sessions", ["inference", "sessions", "admin"])
    message = (await call(app, "POST", EXPORT, body=body, headers=bearer(key))).error(
        403, "insufficient_scope"
    )
    assert "'session_export'" in message
    # A key with the scope gets past the guard: the route itself answers (no such session).
    exporter = await make_key("exporter", ["session_export"])
    reply = await call(app, "POST", EXPORT, body=body, headers=bearer(exporter))
    assert reply.status not in REFUSED, reply.body
    assert reply.json()["error"]["type"] == "session_not_found"
    reply = await call(app, "POST", EXPORT, body=body, headers=bearer(ADMIN_KEY))
    assert reply.json()["error"]["type"] == "session_not_found"


async def test_session_routes_need_the_sessions_scope(app, tiny, env_keys):
    body = {"name": "tiny", "session_id": "nobody"}
    inference_only = await make_key("inference", ["inference"])
    (await call(app, "POST", RELEASE, body=body, headers=bearer(inference_only))).error(
        403, "insufficient_scope"
    )
    reply = await call(app, "POST", RELEASE, body=body, headers=bearer(CLIENT_KEY))
    assert reply.status not in REFUSED, reply.body
    # ... and the inference routes the inference scope.
    sessions_only = await make_key("sessions", ["sessions"])
    (await call(app, "GET", MODELS, headers=bearer(sessions_only))).error(403, "insufficient_scope")


async def test_the_client_key_alone_also_opens_the_operator_routes(app, rt, settings):
    settings.PANTHEON_API_KEY = CLIENT_KEY  # no PANTHEON_ADMIN_API_KEY: the fallback
    settings.PANTHEON_ADMIN_API_KEY = ""
    assert (await call(app, "GET", "/admin/models", headers=bearer(CLIENT_KEY))).status == 200
    reply = await call(app, "POST", EXPORT, body={"session_id": "s"}, headers=bearer(CLIENT_KEY))
    assert reply.status not in REFUSED, reply.body
    (await call(app, "GET", "/admin/models")).error(401, "invalid_api_key")


async def test_the_admin_key_alone_protects_everything(app, rt, settings):
    settings.PANTHEON_API_KEY = ""
    settings.PANTHEON_ADMIN_API_KEY = ADMIN_KEY
    (await call(app, "GET", MODELS)).error(401, "invalid_api_key")
    assert (await call(app, "GET", MODELS, headers=bearer(ADMIN_KEY))).status == 200


# --- console keys ----------------------------------------------------------------------


async def test_a_console_key_alone_turns_the_keys_on(app, rt):
    key = await make_key("ci", ["inference"])
    (await call(app, "GET", MODELS)).error(401, "invalid_api_key")
    assert (await call(app, "GET", MODELS, headers={"x-api-key": key})).status == 200
    (await call(app, "GET", "/admin/models", headers=bearer(key))).error(403, "insufficient_scope")


async def test_a_revoked_key_is_401(app, rt):
    from access.models import ApiKey

    await make_key("other", ["inference"])  # still a key configured
    key = await make_key("old", ["inference"])
    assert (await call(app, "GET", MODELS, headers=bearer(key))).status == 200
    await in_db(lambda: ApiKey.objects.filter(name="old").update(revoked=True))
    (await call(app, "GET", MODELS, headers=bearer(key))).error(401, "invalid_api_key")


async def test_last_used_is_recorded(app, rt):
    from access.models import ApiKey

    key = await make_key("ci", ["inference"])

    def last_used():
        return ApiKey.objects.get(name="ci").last_used_at

    assert await in_db(last_used) is None
    assert (await call(app, "GET", MODELS, headers=bearer(key))).status == 200
    assert await in_db(last_used) is not None


async def test_a_locked_key_table_on_the_last_used_write_still_admits(app, rt, monkeypatch):
    """Two requests on a fresh key both write last_used_at; SQLite may answer the second
    "table is locked" at once. The key was read: the request goes on."""
    from django.db import OperationalError
    from django.db.models import QuerySet

    key = await make_key("busy", ["inference"])

    def locked(self, **fields):
        if "last_used_at" in fields:
            raise OperationalError("database table is locked: access_apikey")
        return real_update(self, **fields)

    real_update = QuerySet.update
    monkeypatch.setattr(QuerySet, "update", locked)
    assert (await call(app, "GET", MODELS, headers=bearer(key))).status == 200


# --- 403 forbidden_host (DNS rebinding) ------------------------------------------------


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8000", "192.168.1.20:8000"])
async def test_a_foreign_host_on_a_loopback_connection_is_403(app, rt, host):
    for path in ("/", MODELS):
        reply = await call(app, "GET", path, headers={"host": host})
        assert "DNS-rebinding" in reply.error(403, "forbidden_host")


@pytest.mark.parametrize(
    "host", ["localhost", "localhost:8000", "app.localhost:8000", "127.0.0.2", "[::1]:8000"]
)
async def test_loopback_host_names_pass(app, rt, host):
    assert (await call(app, "GET", MODELS, headers={"host": host})).status == 200


async def test_any_host_passes_on_a_non_loopback_connection(app, rt):
    reply = await call(
        app, "GET", MODELS, headers={"host": "pantheon.example"}, server=("10.0.0.5", 8000)
    )
    assert reply.status == 200


# --- 403 forbidden_origin --------------------------------------------------------------


async def test_a_foreign_origin_cannot_post(app, rt):
    reply = await call(app, "POST", CHAT, body={}, headers={"origin": "http://evil.example"})
    assert "PANTHEON_ALLOWED_ORIGINS" in reply.error(403, "forbidden_origin")
    # A GET is not state-changing: the origin does not matter.
    ok = await call(app, "GET", MODELS, headers={"origin": "http://evil.example"})
    assert ok.status == 200


@pytest.mark.parametrize("origin", [f"http://{HOST}", "http://127.0.0.1:8000/"])
async def test_the_servers_own_origin_may_post(app, rt, origin):
    reply = await call(app, "POST", CHAT, body={}, headers={"origin": origin})
    assert reply.status == 400, reply.body  # past the guard: the chat view refuses {}


async def test_the_port_is_part_of_the_origin(app, rt):
    reply = await call(app, "POST", CHAT, body={}, headers={"origin": "http://127.0.0.1:9999"})
    reply.error(403, "forbidden_origin")
    reply = await call(app, "POST", CHAT, body={}, headers={"origin": "http://127.0.0.1"})
    reply.error(403, "forbidden_origin")


async def test_a_host_without_a_port_takes_the_origins_default_port(app, rt):
    """As behind a TLS-terminating proxy: Host "pantheon.example", Origin https://..."""
    server = ("10.0.0.5", 8000)
    same = {"host": "pantheon.example", "origin": "https://pantheon.example"}
    reply = await call(app, "POST", CHAT, body={}, headers=same, server=server)
    assert reply.status == 400, reply.body
    other = {"host": "pantheon.example", "origin": "https://pantheon.example:8443"}
    reply = await call(app, "POST", CHAT, body={}, headers=other, server=server)
    reply.error(403, "forbidden_origin")


@pytest.mark.parametrize("allowed", [["http://app.example"], ["*"]])
async def test_allowed_origins_may_post(app, rt, settings, allowed):
    settings.PANTHEON_ALLOWED_ORIGINS = allowed
    reply = await call(app, "POST", CHAT, body={}, headers={"origin": "http://app.example"})
    assert reply.status == 400, reply.body
    if allowed != ["*"]:
        other = await call(app, "POST", CHAT, body={}, headers={"origin": "http://b.example"})
        other.error(403, "forbidden_origin")


# --- 415 -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "content_type",
    ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"],
)
@pytest.mark.parametrize("path", [UNLOAD, LOAD, EXPORT, RELEASE, "/session/restore"])
async def test_a_non_json_body_to_a_management_route_is_415(app, rt, path, content_type):
    reply = await call(
        app, "POST", path, body=b'{"name":"x"}', headers={"content-type": content_type}
    )
    assert "application/json" in reply.error(415, "unsupported_media_type")


@pytest.mark.parametrize(
    "content_type", ["application/json", "application/json; charset=utf-8", None]
)
async def test_json_or_no_content_type_passes(app, tiny, content_type):
    reply = await call(
        app, "POST", UNLOAD, body=b'{"name":"tiny"}', headers={"content-type": content_type}
    )
    assert reply.status == 200, reply.body
    assert "tiny" not in tiny.services()


async def test_client_routes_keep_their_own_content_type_handling(app, rt):
    reply = await call(app, "POST", CHAT, body=b"{}", headers={"content-type": "text/plain"})
    assert reply.status == 400, reply.body  # the chat view's own answer, not the guard's


# --- the acceptance attacks ------------------------------------------------------------


async def test_a_rebinding_page_cannot_unload(app, tiny):
    reply = await call(app, "POST", UNLOAD, body={"name": "tiny"}, headers={"host": "evil.example"})
    reply.error(403, "forbidden_host")
    assert "tiny" in tiny.services()
    assert tiny.states()["tiny"].state == "loaded"


async def test_a_cross_site_form_cannot_unload(app, tiny, settings):
    form = {"content-type": "text/plain", "origin": "http://evil.example"}
    reply = await call(app, "POST", UNLOAD, body=b'{"name":"tiny"}', headers=form)
    reply.error(403, "forbidden_origin")
    assert "tiny" in tiny.services()
    # Even from an allowed origin, a form's body type is refused.
    settings.PANTHEON_ALLOWED_ORIGINS = ["*"]
    reply = await call(app, "POST", UNLOAD, body=b'{"name":"tiny"}', headers=form)
    reply.error(415, "unsupported_media_type")
    assert "tiny" in tiny.services()
    assert tiny.states()["tiny"].state == "loaded"
    # The same request as a JSON client sends it does unload: the refusals were the guard's.
    assert (await call(app, "POST", UNLOAD, body={"name": "tiny"})).status == 200
    assert "tiny" not in tiny.services()


async def test_checks_run_before_the_key(app, tiny, env_keys):
    """A rebinding page with a stolen key still gets the host refusal, and a form post
    the media-type refusal: the browser defences do not depend on keys."""
    reply = await call(
        app,
        "POST",
        UNLOAD,
        body={"name": "tiny"},
        headers={"host": "evil.example", **bearer(ADMIN_KEY)},
    )
    reply.error(403, "forbidden_host")
    reply = await call(app, "POST", UNLOAD, body=b"x", headers={"content-type": "text/plain"})
    reply.error(415, "unsupported_media_type")
    assert "tiny" in tiny.services()


# --- 429 per-key quota, and the key label for the access log ---------------------------


class HeldApp:
    """An inner app whose responses wait until released; records the scopes it saw."""

    def __init__(self):
        self.release = asyncio.Event()
        self.entered = 0
        self.scopes = []

    async def __call__(self, scope, receive, send):
        self.entered += 1
        self.scopes.append(scope)
        await self.release.wait()
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})


async def _until(predicate, timeout=10.0):
    async with asyncio.timeout(timeout):
        while not predicate():
            await asyncio.sleep(0.01)


async def test_a_key_past_its_concurrency_quota_gets_429(settings, env_keys):
    from access.guard import AccessGuard

    settings.PANTHEON_KEY_MAX_CONCURRENT = 1
    inner = HeldApp()
    guard = AccessGuard(inner)
    first = asyncio.create_task(call(guard, "GET", MODELS, headers=bearer(CLIENT_KEY)))
    await _until(lambda: inner.entered == 1)
    reply = await call(guard, "GET", MODELS, headers=bearer(CLIENT_KEY))
    assert "PANTHEON_KEY_MAX_CONCURRENT" in reply.error(429, "key_concurrency_exceeded")
    assert reply.headers["retry-after"] == "1"
    # Another key has its own count.
    other = asyncio.create_task(call(guard, "GET", MODELS, headers=bearer(ADMIN_KEY)))
    await _until(lambda: inner.entered == 2)
    inner.release.set()
    assert (await first).status == 200 and (await other).status == 200
    # Once the first has finished (its whole response sent), the key may call again.
    assert (await call(guard, "GET", MODELS, headers=bearer(CLIENT_KEY))).status == 200
    assert guard.in_flight == {}
    labels = [scope.get("pantheon.key") for scope in inner.scopes]
    assert labels == ["env:client", "env:admin", "env:client"]


async def test_a_console_keys_own_limit_overrides_the_setting(settings):
    from access.guard import AccessGuard

    settings.PANTHEON_KEY_MAX_CONCURRENT = 1
    key = await make_key("batch", ["inference"], max_concurrent=2)
    inner = HeldApp()
    guard = AccessGuard(inner)
    held = [asyncio.create_task(call(guard, "GET", MODELS, headers=bearer(key))) for _ in "ab"]
    await _until(lambda: inner.entered == 2)
    (await call(guard, "GET", MODELS, headers=bearer(key))).error(429, "key_concurrency_exceeded")
    inner.release.set()
    assert [(await task).status for task in held] == [200, 200]
    assert inner.scopes[0]["pantheon.key"] == f"console:{key[:10]}"


async def test_no_quota_without_a_key(settings):
    from access.guard import AccessGuard

    settings.PANTHEON_KEY_MAX_CONCURRENT = 1
    inner = HeldApp()
    guard = AccessGuard(inner)
    held = [asyncio.create_task(call(guard, "GET", MODELS)) for _ in "ab"]
    await _until(lambda: inner.entered == 2)
    inner.release.set()
    assert [(await task).status for task in held] == [200, 200]
    assert "pantheon.key" not in inner.scopes[0]


async def test_other_scope_types_pass_through():
    from access.guard import AccessGuard

    seen = []

    async def inner(scope, receive, send):
        seen.append(scope["type"])

    await AccessGuard(inner)({"type": "lifespan"}, None, None)
    assert seen == ["lifespan"]


async def test_an_unreadable_key_table_fails_closed(app, rt, monkeypatch):
    from channels.db import database_sync_to_async
    from django.db import OperationalError

    from access import guard

    def broken():
        raise OperationalError("no such table: access_apikey")

    monkeypatch.setattr(guard, "_console_keys_exist", database_sync_to_async(broken))
    reply = await call(app, "GET", MODELS)
    assert "migrate" in reply.error(503, "key_store_unavailable")
    assert (await call(app, "GET", "/")).status == 200  # open routes need no key table


async def test_a_key_with_sessions_gets_to_the_watch(app, tiny, env_keys):
    reply = await call(app, "GET", "/session/watch", headers=bearer(CLIENT_KEY), timeout=10)
    assert reply.status not in REFUSED, reply.body
