"""Fixtures for the access tests: the real ASGI stack (pantheon_site.stack, without the
model loader pantheon_site.asgi starts) and a registry serving a tiny model."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.access.helpers import ADMIN_KEY, CLIENT_KEY
from tests.operators.helpers import install
from tests.tiny_gguf import write_tiny_llama


@pytest.fixture(autouse=True)
def fresh_key_cache():
    """Whether any console key is configured is cached; a test database's rollback or flush
    sends no signal, so every test starts (and ends) with nothing cached."""
    from access import keys

    keys.forget_cache()
    yield
    keys.forget_cache()


@pytest.fixture
def app():
    """The whole ASGI application (every layer of pantheon_site.stack around Django)."""
    from django.core.asgi import get_asgi_application

    from pantheon_site import stack

    return stack.build(get_asgi_application())


@pytest.fixture
def env_keys(settings):
    settings.PANTHEON_API_KEY = CLIENT_KEY
    settings.PANTHEON_ADMIN_API_KEY = ADMIN_KEY


@pytest.fixture
def model_dir(tmp_path: Path, settings) -> Path:
    folder = (tmp_path / "models").resolve()
    folder.mkdir()
    write_tiny_llama(folder / "tiny.gguf")
    settings.PANTHEON_MODEL_DIRS = [folder]
    return folder


@pytest.fixture
def rt(monkeypatch, model_dir):
    """A fresh registry serving both the client and the operator routes (no database)."""
    from pantheon_platform.runtime import Runtime

    fresh = Runtime()
    install(monkeypatch, fresh)
    yield fresh
    fresh.close()


@pytest.fixture
def tiny(rt):
    """`tiny` loaded: the model the attacks try to unload."""
    from pantheon_platform.runtime import LoadSpec

    rt.load(LoadSpec.of(name="tiny", path="tiny.gguf"))
    assert "tiny" in rt.services()
    return rt
