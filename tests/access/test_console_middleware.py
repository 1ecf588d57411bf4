"""pantheon_platform/console_middleware.py under the ASGI handler: the console's paths go
through Django's session, CSRF, login and messages middlewares; every other path gets
their security and framing headers without any of their hooks (each a thread hop)."""

from __future__ import annotations

import asyncio

import pytest
from django.contrib.messages.middleware import MessageMiddleware
from django.contrib.sessions.middleware import SessionMiddleware
from django.middleware.csrf import CsrfViewMiddleware

from tests.access.helpers import call

pytestmark = pytest.mark.django_db(transaction=True)

SECURITY_HEADERS = {
    "x-content-type-options": "nosniff",
    "x-frame-options": "DENY",
    "referrer-policy": "same-origin",
    "cross-origin-opener-policy": "same-origin",
}


@pytest.fixture
def hooks_called(monkeypatch) -> list[str]:
    called: list[str] = []
    for cls in (SessionMiddleware, CsrfViewMiddleware, MessageMiddleware):
        for name in ("process_request", "process_view", "process_response"):
            original = getattr(cls, name, None)
            if original is None:
                continue

            def spy(self, *args, _original=original, _name=f"{cls.__name__}.{name}"):
                called.append(_name)
                return _original(self, *args)

            monkeypatch.setattr(cls, name, spy)
    return called


def test_an_api_route_gets_the_headers_without_the_console_s_middlewares(app, hooks_called):
    response = asyncio.run(call(app, "GET", "/v1/models"))
    assert response.status == 200
    for header, value in SECURITY_HEADERS.items():
        assert response.headers.get(header) == value, header
    assert "set-cookie" not in response.headers
    assert hooks_called == []


def test_the_console_runs_them_and_refuses_a_post_without_its_csrf_token(app, hooks_called):
    page = asyncio.run(call(app, "GET", "/console/login/", headers={"Accept": "text/html"}))
    assert page.status == 200
    assert "csrftoken" in page.headers.get("set-cookie", "")
    assert "SessionMiddleware.process_request" in hooks_called
    assert "CsrfViewMiddleware.process_view" in hooks_called
    for header, value in SECURITY_HEADERS.items():
        assert page.headers.get(header) == value, header
    form = b"username=op&password=nope"
    refused = asyncio.run(
        call(
            app,
            "POST",
            "/console/login/",
            body=form,
            headers={"Content-Type": "application/x-www-form-urlencoded"},
        )
    )
    assert refused.status == 403
