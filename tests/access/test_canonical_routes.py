"""Routing is canonical before access checks (pantheon_platform.routes.canonical, applied by
the outermost ASGI layer pantheon_site.stack.canonical_path): every route of the URL table
(Django's resolver and the Channels routes), spelled with double slashes or dot segments,
needs the scope of its canonical path and reaches the same handler.

The percent-encoded spellings (`/session%2Fwatch`) are decoded by Daphne before the
application sees them; tests/e2e/test_daphne_edge.py sends those over a real server.
"""

from __future__ import annotations

import asyncio

import pytest

from pantheon_platform import routes
from tests.access.helpers import LOOPBACK, bearer, call, make_key
from tests.wire.test_openapi import _concrete, channels_routes, django_routes

pytestmark = [pytest.mark.anyio, pytest.mark.django_db(transaction=True)]

ADMIN_KEY = "canonical-admin-key"


def spellings(path: str) -> list[str]:
    """Non-canonical spellings of `path` (a canonical path without a trailing slash)."""
    inner = path[1:]
    first, _, rest = inner.partition("/")
    found = [
        "/" + path,  # //session/watch
        path.replace("/", "//"),  # //session//watch
        "/./" + inner,  # /./session/watch
        "/nowhere/../" + inner,  # /nowhere/../session/watch
        "/../" + inner,  # above the root stays at the root
    ]
    if rest:
        found.append(f"/{first}/./{rest}")
        found.append(f"/{first}/x/../{rest}")
    return found


def route_table(monkeypatch) -> list[str]:
    paths = [*django_routes(), *channels_routes(monkeypatch)]
    return sorted({_concrete(p) for p in paths})


def test_every_route_has_one_canonical_spelling(monkeypatch):
    for path in route_table(monkeypatch):
        assert routes.canonical(path) == path
        for spelled in spellings(path):
            canonical = routes.canonical(spelled)
            if spelled.endswith("/."):
                assert canonical == path + "/", spelled
            else:
                assert canonical == path, spelled
            assert routes.scope_for(routes.canonical(spelled.rstrip("."))) == routes.scope_for(path)


@pytest.mark.parametrize(
    ("spelled", "canonical"),
    [
        ("/", "/"),
        ("", "/"),
        ("//", "/"),
        ("/console/", "/console/"),
        ("/console//", "/console/"),
        ("/console/..", "/"),
        ("/a/b/../../../c", "/c"),
        ("/session%2Fwatch", "/session%2Fwatch"),  # decoded once (by Daphne), never twice
    ],
)
def test_canonical_spellings(spelled, canonical):
    assert routes.canonical(spelled) == canonical


@pytest.fixture
def app():
    from django.core.asgi import get_asgi_application

    from access import keys
    from pantheon_site import stack

    keys.forget_cache()
    yield stack.build(get_asgi_application())
    keys.forget_cache()


@pytest.fixture
def empty_runtime(monkeypatch):
    from pantheon_platform.runtime import Runtime
    from tests.operators.helpers import install

    fresh = Runtime()
    install(monkeypatch, fresh)
    yield fresh
    fresh.close()


async def test_every_spelling_needs_its_routes_scope_and_reaches_its_route(
    app, empty_runtime, monkeypatch, settings
):
    """An inference-only key: every session, export and operator route is 403 in every
    spelling (`//session/watch` was not: it held a watch); every other route answers a
    spelling as it answers the canonical path."""
    settings.PANTHEON_ADMIN_API_KEY = ADMIN_KEY
    inference_only = bearer(await make_key("inference-only", [routes.INFERENCE]))
    checked = 0
    for path in route_table(monkeypatch):
        needed = routes.scope_for(path)
        for method in ("GET", "POST"):
            body = {} if method == "POST" else None
            want = await call(app, method, path, body=body, headers=inference_only)
            if needed not in (routes.INFERENCE, routes.OPEN):
                assert f"'{needed}' scope" in want.error(403, "insufficient_scope"), path
            for spelled in spellings(path):
                got = await call(app, method, spelled, body=body, headers=inference_only)
                assert (got.status, got.body) == (want.status, want.body), (method, spelled)
                checked += 1
    assert checked > 200


async def test_a_root_path_is_not_taken_from_the_client(app, empty_runtime, settings):
    """Daphne takes root_path from any client's Daphne-Root-Path header; the router then
    strips it from the path. The canonical layer drops it: the whole path is routed."""
    settings.PANTHEON_ADMIN_API_KEY = ADMIN_KEY
    inference_only = bearer(await make_key("inference-only", [routes.INFERENCE]))
    from tests.access.asgi_raw import Raw
    from tests.support import asgi_scope

    scope = {
        **asgi_scope("GET", "/x/admin/models"),
        "root_path": "/x",
        "headers": [
            (b"host", b"127.0.0.1:8000"),
            (b"authorization", inference_only["authorization"].encode()),
        ],
        "server": LOOPBACK,
    }
    raw = Raw()
    sent = []

    async def receive():
        if not sent:
            sent.append(True)
            return {"type": "http.request", "body": b"", "more_body": False}
        await asyncio.Event().wait()  # the client stays until the answer is sent

    async def send(message):
        if message["type"] == "http.response.start":
            raw.status = message["status"]

    await app(scope, receive, send)
    assert raw.status == 404  # /x/admin/models: no such route (not the operator listing)
