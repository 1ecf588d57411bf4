"""Fixtures for the operator tests: a fresh registry in place of the process-wide one,
and a model folder holding tiny GGUFs (real files that load in milliseconds)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.operators.helpers import Api, install
from tests.tiny_gguf import write_tiny_llama


@pytest.fixture
def model_dir(tmp_path: Path, settings) -> Path:
    """The only model folder: tiny.gguf and other.gguf (different weights)."""
    folder = (tmp_path / "models").resolve()
    folder.mkdir()
    write_tiny_llama(folder / "tiny.gguf")
    write_tiny_llama(folder / "other.gguf", seed=1, n_layer=3)
    settings.PANTHEON_MODEL_DIRS = [folder]
    return folder


@pytest.fixture
def rt(monkeypatch):
    """A fresh registry that remembers nothing across restarts (no database)."""
    from pantheon_platform.runtime import Runtime

    fresh = Runtime()
    install(monkeypatch, fresh)
    yield fresh
    fresh.close()


@pytest.fixture
def db_rt(monkeypatch, transactional_db):
    """A fresh registry that records every change in the database (operators.store)."""
    from operators.store import DatabaseStore
    from pantheon_platform.runtime import Runtime

    fresh = Runtime(DatabaseStore())
    install(monkeypatch, fresh)
    yield fresh
    fresh.close()


@pytest.fixture
def api() -> Api:
    return Api()
