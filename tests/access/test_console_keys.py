"""API keys made in the console (/console/access/apikey/): stored hashed, shown once,
revocable; a key made there works against the server."""

from __future__ import annotations

import asyncio
import re

import pytest
from django.test import Client

from access.models import ApiKey
from tests.access.helpers import bearer, call

pytestmark = pytest.mark.django_db(transaction=True)

CHANGELIST = "/console/access/apikey/"
ADD = CHANGELIST + "add/"
KEY = re.compile(r"pn_[A-Za-z0-9_-]{20,}")


@pytest.fixture
def console(django_user_model) -> Client:
    user = django_user_model.objects.create_superuser("op", "op@example.com", "unused-pw")
    client = Client()
    client.force_login(user)
    return client


def add_key(console: Client, name: str, scopes: list[str], **fields):
    return console.post(ADD, {"name": name, "scopes": scopes, **fields}, follow=True)


def test_a_new_key_is_shown_once_and_stored_hashed(console, app, rt):
    response = add_key(console, "ci", ["inference", "sessions"], max_concurrent="2")
    assert response.status_code == 200
    page = response.content.decode()
    shown = KEY.findall(page)
    assert len(set(shown)) == 1, page
    key = shown[0]
    assert "will not be shown again" in page

    row = ApiKey.objects.get(name="ci")
    assert row.scopes == ["inference", "sessions"] and row.max_concurrent == 2
    assert row.prefix == key[:10] and not row.revoked
    from access.keys import digest

    assert row.key_hash == digest(key) and key not in row.key_hash
    stored = [str(v) for v in ApiKey.objects.values_list(flat=False).get(pk=row.pk)]
    assert not any(key in value for value in stored)

    # Never again: not in the list, not on the key's page.
    for path in (CHANGELIST, f"{CHANGELIST}{row.pk}/change/"):
        again = console.get(path).content.decode()
        assert key not in again and row.prefix in again

    # The key works, with its scopes.
    assert asyncio.run(call(app, "GET", "/v1/models", headers=bearer(key))).status == 200
    refused = asyncio.run(call(app, "GET", "/admin/models", headers=bearer(key)))
    refused.error(403, "insufficient_scope")
    asyncio.run(call(app, "GET", "/v1/models")).error(401, "invalid_api_key")


def test_the_add_form_needs_a_scope_and_knows_only_the_four(console):
    response = add_key(console, "none", [])
    assert response.status_code == 200 and "This field is required" in response.content.decode()
    response = add_key(console, "bad", ["everything"])
    assert "Select a valid choice" in response.content.decode()
    assert not ApiKey.objects.exists()


def test_the_list_shows_name_prefix_scopes_and_use(console):
    add_key(console, "ci", ["inference", "session_export"])
    page = console.get(CHANGELIST).content.decode()
    row = ApiKey.objects.get()
    for text in ("ci", row.prefix, "inference, session_export", "Revoke the selected"):
        assert text in page, text
    assert "last used" in page.lower()


def test_revoke_refuses_the_key_from_then_on(console, app, rt):
    page = add_key(console, "old", ["inference"]).content.decode()
    key = KEY.findall(page)[0]
    add_key(console, "still here", ["inference"])  # so a key is still configured
    assert asyncio.run(call(app, "GET", "/v1/models", headers=bearer(key))).status == 200
    row = ApiKey.objects.get(name="old")
    response = console.post(
        CHANGELIST, {"action": "revoke", "_selected_action": [row.pk]}, follow=True
    )
    assert "Revoked 1 API key" in response.content.decode()
    assert ApiKey.objects.get(name="old").revoked
    reply = asyncio.run(call(app, "GET", "/v1/models", headers=bearer(key)))
    reply.error(401, "invalid_api_key")


def test_revoking_the_last_key_reopens_the_server(console, app, rt):
    """ "A key configured" means an active one: with none left, the contract's open server."""
    add_key(console, "only", ["inference"])
    asyncio.run(call(app, "GET", "/v1/models")).error(401, "invalid_api_key")
    row = ApiKey.objects.get()
    console.post(CHANGELIST, {"action": "revoke", "_selected_action": [row.pk]})
    assert asyncio.run(call(app, "GET", "/v1/models")).status == 200


def test_the_console_keeps_csrf_protection(django_user_model):
    user = django_user_model.objects.create_superuser("op", "op@example.com", "unused-pw")
    client = Client(enforce_csrf_checks=True)
    client.force_login(user)
    response = client.post(ADD, {"name": "x", "scopes": ["admin"]})
    assert response.status_code == 403
    assert not ApiKey.objects.exists()
