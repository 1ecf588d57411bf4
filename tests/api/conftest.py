"""Fixtures for driving the Django app in-process: the async test client and raw ASGI."""

from __future__ import annotations

import json

import pytest
from django.test import AsyncClient

from tests.api.helpers import CHAT


@pytest.fixture
def client() -> AsyncClient:
    return AsyncClient(enforce_csrf_checks=True)  # as a real client: no CSRF token


@pytest.fixture
def post_chat(client):
    """POST a body (dict -> JSON; bytes/str sent as is) to /v1/chat/completions."""

    async def post(body, content_type="application/json"):
        data = body if isinstance(body, bytes | str) else json.dumps(body)
        return await client.post(CHAT, data=data, content_type=content_type)

    return post


@pytest.fixture
def asgi_app():
    from django.core.asgi import get_asgi_application

    return get_asgi_application()
