"""PANTHEON_SPECULATION: auto (the default) or off, read once at start into every model's
engine config; /admin/config lists it read-only; any other value stops the start."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from django.test import Client

from pantheon_platform.runtime.load_spec import LoadSpec

IMPORT_SETTINGS = (
    "import pantheon_site.settings as s; print(s.PANTHEON_ENGINE_OPTIONS['speculation'])"
)


def _start(value: str | None) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PANTHEON_SPECULATION"}
    if value is not None:
        env["PANTHEON_SPECULATION"] = value
    return subprocess.run(
        [sys.executable, "-c", IMPORT_SETTINGS],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_the_setting_is_auto_or_off_and_nothing_else():
    assert _start(None).stdout.strip() == "auto"
    assert _start("off").stdout.strip() == "off"
    refused = _start("fast")
    assert refused.returncode != 0
    assert "PANTHEON_SPECULATION='fast': expected auto or off" in refused.stderr


def test_it_reaches_each_models_engine_config(settings):
    spec = LoadSpec.of("m", "/models/m.gguf")
    assert spec.engine_config().speculation == "auto"
    settings.PANTHEON_ENGINE_OPTIONS = {**settings.PANTHEON_ENGINE_OPTIONS, "speculation": "off"}
    assert spec.engine_config().speculation == "off"


@pytest.mark.django_db
def test_admin_config_lists_it_read_only(settings):
    client = Client(enforce_csrf_checks=True)
    settings.PANTHEON_ENGINE_OPTIONS = {**settings.PANTHEON_ENGINE_OPTIONS, "speculation": "off"}
    row = client.get("/admin/config").json()["settings"]["speculation"]
    assert row["value"] == "off" and row["mutable"] is False
    assert row["env"] == "PANTHEON_SPECULATION"
    response = client.patch(
        "/admin/config", data={"speculation": "auto"}, content_type="application/json"
    )
    assert response.status_code == 400
    assert "set PANTHEON_SPECULATION and restart the server" in response.json()["error"]["message"]
