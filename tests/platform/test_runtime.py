"""pantheon_platform.runtime routing and loading, and the settings' environment parsing."""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from engine.types import ModelConfig
from pantheon_platform.runtime import FAILED, LOADED, ModelNotFound, NoModelsLoaded, Runtime
from pantheon_site import env


class Served:
    """Routing looks at names only; any object stands in for a loaded service here."""


def test_resolve_with_nothing_loaded_says_why():
    with pytest.raises(NoModelsLoaded, match="none is configured"):
        Runtime().resolve("x")


def test_one_loaded_model_takes_any_name_or_none():
    rt = Runtime()
    svc = Served()
    rt.register("only", svc)
    assert rt.resolve("only") == ("only", svc)
    assert rt.resolve("gpt-4o") == ("only", svc)
    assert rt.resolve(None) == ("only", svc)
    assert rt.resolve("") == ("only", svc)


def test_several_loaded_models_need_the_exact_name():
    rt = Runtime()
    a, b = Served(), Served()
    rt.register("a", a)
    rt.register("b", b)
    assert rt.resolve("b") == ("b", b)
    with pytest.raises(ModelNotFound, match="'c' is not loaded; loaded models: a, b"):
        rt.resolve("c")
    with pytest.raises(ModelNotFound, match="name one"):
        rt.resolve(None)


def test_unregister_stops_serving_a_name():
    rt = Runtime()
    svc = Served()
    rt.register("a", svc)
    assert rt.unregister("a") is svc
    assert rt.services() == {} and rt.states() == {}


def test_a_failed_load_is_recorded_and_does_not_stop_the_next(tmp_path, smollm2_path):
    rt = Runtime()
    rt.start_loading(
        [
            ModelConfig(name="broken", path=str(tmp_path / "nope.gguf")),
            ModelConfig(name="good", path=str(smollm2_path), ctx_cap=256),
        ]
    )
    rt.start_loading([ModelConfig(name="ignored", path="x")])  # idempotent: no second loader
    try:
        assert rt.wait_loaded(timeout=300)
        states = rt.states()
        assert states["broken"].state == FAILED and "nope.gguf" in states["broken"].error
        assert states["good"].state == LOADED
        assert "ignored" not in states
        name, svc = rt.resolve("whatever")
        assert name == "good" and svc.context_window == 256
    finally:
        rt.close()


def test_still_loading_is_a_503_reason(monkeypatch):
    rt = Runtime()
    gate = threading.Event()

    def slow_load(cfg):
        gate.wait(10)

    monkeypatch.setattr(rt, "_load_one", slow_load)
    rt.start_loading([ModelConfig(name="big", path="big.gguf")])
    try:
        assert rt.states()["big"].state == "loading"
        with pytest.raises(NoModelsLoaded, match="still loading big"):
            rt.resolve(None)
    finally:
        gate.set()
        rt.wait_loaded(10)


# --- pantheon_site.env ----------------------------------------------------------------


def test_env_helpers(monkeypatch):
    monkeypatch.setenv("P_INT", " 12 ")
    monkeypatch.setenv("P_BOOL", "Yes")
    monkeypatch.setenv("P_LIST", "a, b,,c")
    monkeypatch.setenv("P_EMPTY", "  ")
    assert env.env_int("P_INT", 0) == 12
    assert env.env_bool("P_BOOL") is True
    assert env.env_list("P_LIST") == ["a", "b", "c"]
    assert env.env_str("P_EMPTY", "dflt") == "dflt"
    assert env.env_int("P_UNSET_X", 7) == 7
    monkeypatch.setenv("P_INT", "twelve")
    with pytest.raises(env.EnvError, match="P_INT"):
        env.env_int("P_INT", 0)
    monkeypatch.setenv("P_BOOL", "maybe")
    with pytest.raises(env.EnvError, match="P_BOOL"):
        env.env_bool("P_BOOL")


def test_env_path_is_absolute(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("P_PATH", "data")
    assert env.env_path("P_PATH", Path("/x")) == tmp_path.resolve() / "data"
    assert env.env_path("P_UNSET_PATH", Path("/x")) == Path("/x")


def test_model_specs_name_path_pairs_and_bare_paths(tmp_path, monkeypatch):
    models = tmp_path / "models"
    models.mkdir()
    (models / "tiny.gguf").write_bytes(b"GGUF")
    monkeypatch.chdir(tmp_path)
    specs = env.parse_model_specs(
        ["chat=tiny.gguf", "tiny.gguf", "other=/abs/other.gguf", "missing.gguf"], [models]
    )
    assert specs == [
        ("chat", str(models / "tiny.gguf")),
        ("tiny", str(models / "tiny.gguf")),
        ("other", "/abs/other.gguf"),
        ("missing", "missing.gguf"),  # kept as given: its load fails with a clear error
    ]
    with pytest.raises(env.EnvError, match="twice"):
        env.parse_model_specs(["a=x.gguf", "a=y.gguf"], [])
    with pytest.raises(env.EnvError, match="no path"):
        env.parse_model_specs(["a="], [])


def test_default_settings_serve_the_shipped_model(settings, smollm2_path):
    if any(os.environ.get(k) for k in ("PANTHEON_MODELS", "PANTHEON_MODEL_DIRS")):
        pytest.skip("PANTHEON_MODELS / PANTHEON_MODEL_DIRS set in this environment")
    assert settings.PANTHEON_MODELS == [
        {
            "name": "smollm2-135m-instruct",
            "path": str(smollm2_path),
            "ctx_cap": 0,
            "max_sessions": 4,
            "max_concurrent": 0,
            "reasoning_budget": 0,
        }
    ]
    assert smollm2_path.parent in settings.PANTHEON_MODEL_DIRS
    assert settings.DATA_DIR.is_dir()
    assert "sessions.apps.SessionsConfig" in settings.INSTALLED_APPS
