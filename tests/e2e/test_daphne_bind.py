"""The real server on a non-loopback address: with no key it refuses to start and says
why; with a key it serves, GET / open and every other route behind the key."""

from __future__ import annotations

import os
import subprocess
import sys

import httpx
import pytest

from tests.e2e.daphne_server import REPO_ROOT, free_port, migrate, running_server
from tests.tiny_gguf import write_tiny_llama

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def tiny_model(tmp_path):
    folder = tmp_path / "models"
    folder.mkdir()
    write_tiny_llama(folder / "tiny.gguf")
    return folder / "tiny.gguf"


def test_a_public_bind_without_a_key_refuses_to_start(tmp_path, tiny_model):
    env = {
        k: v
        for k, v in os.environ.items()
        if k not in ("PANTHEON_API_KEY", "PANTHEON_ADMIN_API_KEY", "PANTHEON_ALLOW_UNAUTHENTICATED")
    }
    env |= {
        "DJANGO_SETTINGS_MODULE": "pantheon_site.settings",
        "PANTHEON_DATA_DIR": str(tmp_path / "data"),
        "PANTHEON_MODELS": f"tiny={tiny_model}",
        "PANTHEON_MODEL_DIRS": str(tiny_model.parent),
    }
    migrate(tmp_path / "data", env)
    result = subprocess.run(
        [sys.executable, "-m", "daphne", "-b", "0.0.0.0", "-p", str(free_port())]
        + ["pantheon_site.asgi:application"],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert "refusing to start" in result.stderr
    assert "PANTHEON_API_KEY" in result.stderr
    assert "PANTHEON_ALLOW_UNAUTHENTICATED=1" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_public_bind_with_a_key_serves_behind_it(tmp_path, tiny_model):
    key = "e2e-client-key"
    with running_server(
        tmp_path / "data",
        {"tiny": tiny_model},
        bind="0.0.0.0",
        PANTHEON_API_KEY=key,
        PANTHEON_ADMIN_API_KEY="",
    ) as srv:
        assert httpx.get(srv.url + "/", timeout=10).status_code == 200
        refused = httpx.get(srv.url + "/v1/models", timeout=10)
        assert refused.status_code == 401
        assert refused.json()["error"]["type"] == "invalid_api_key"
        assert refused.headers["access-control-allow-origin"] == "*"
        models = httpx.get(
            srv.url + "/v1/models", headers={"Authorization": f"Bearer {key}"}, timeout=10
        )
        assert models.status_code == 200
        assert [m["id"] for m in models.json()["data"]] == ["tiny"]
        # A rebinding page reaching the loopback interface is refused even with the key.
        rebound = httpx.get(
            srv.url + "/v1/models",
            headers={"Authorization": f"Bearer {key}", "Host": "evil.example"},
            timeout=10,
        )
        assert rebound.status_code == 403
        assert rebound.json()["error"]["type"] == "forbidden_host"


def test_a_public_bind_may_serve_unauthenticated_when_told(tmp_path, tiny_model):
    with running_server(
        tmp_path / "data",
        {"tiny": tiny_model},
        bind="0.0.0.0",
        PANTHEON_API_KEY="",
        PANTHEON_ADMIN_API_KEY="",
        PANTHEON_ALLOW_UNAUTHENTICATED="1",
    ) as srv:
        assert httpx.get(srv.url + "/v1/models", timeout=10).status_code == 200
