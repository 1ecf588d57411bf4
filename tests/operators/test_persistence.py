"""operators.store: loads, unloads, pins and aliases are recorded in the database, and a
new registry (a restart) loads exactly what was loaded. PANTHEON_MODELS only seeds an
empty database. Tiny real GGUFs; the start-up loader reads the database from its thread."""

from __future__ import annotations

import pytest

from operators.models import Alias, ServedModel
from operators.store import DatabaseStore
from pantheon_platform.runtime import FAILED, LoadSpec, Runtime, Store


def restart() -> Runtime:
    """A new registry on the same database, started the way pantheon_site.asgi does it."""
    fresh = Runtime(DatabaseStore())
    fresh.start_loading()
    assert fresh.wait_loaded(30)
    return fresh


def test_loads_unloads_pins_and_aliases_are_recorded(db_rt, model_dir):
    db_rt.load(LoadSpec.of(name="chat", path="tiny.gguf", ctx_cap=128, max_sessions=2, pinned=True))
    db_rt.load(LoadSpec.of(name="second", path="other.gguf"))
    db_rt.set_alias("gpt-4o", "chat")

    row = ServedModel.objects.get(name="chat")
    assert row.path == str(model_dir / "tiny.gguf")  # resolved, as loaded
    assert (row.ctx_cap, row.max_sessions, row.pinned, row.should_load) == (128, 2, True, True)
    assert row.loaded_at is not None and row.last_error == ""
    assert dict(Alias.objects.values_list("alias", "target")) == {"gpt-4o": "chat"}

    db_rt.unload("second")
    db_rt.set_pinned("chat", False)
    db_rt.delete_alias("gpt-4o")
    assert ServedModel.objects.get(name="second").should_load is False
    assert ServedModel.objects.get(name="chat").pinned is False
    assert not Alias.objects.exists()


def test_an_eviction_is_recorded_as_an_unload(db_rt, model_dir, settings):
    settings.PANTHEON_MAX_LOADED_MODELS = 1
    db_rt.load(LoadSpec.of(name="old", path="tiny.gguf"))
    db_rt.load(LoadSpec.of(name="new", path="tiny.gguf"))
    assert dict(ServedModel.objects.values_list("name", "should_load")) == {
        "old": False,
        "new": True,
    }


def test_a_restart_loads_what_was_loaded_with_its_pins_and_aliases(db_rt, model_dir, settings):
    settings.PANTHEON_MODELS = [{"name": "from-env", "path": str(model_dir / "tiny.gguf")}]
    db_rt.load(LoadSpec.of(name="kept", path="tiny.gguf", ctx_cap=64, pinned=True))
    db_rt.load(LoadSpec.of(name="dropped", path="other.gguf"))
    db_rt.unload("dropped")
    db_rt.set_alias("fast", "kept")
    db_rt.close()

    after = restart()
    try:
        assert set(after.services()) == {"kept"}  # not "dropped", and the env only seeds
        info = after.instance("kept")
        assert info.pinned and info.svc.context_window == 64 and info.aliases == ("fast",)
        assert after.resolve("fast")[0] == "kept"
        assert not ServedModel.objects.filter(name="from-env").exists()
    finally:
        after.close()


def test_an_empty_database_is_seeded_from_pantheon_models(transactional_db, model_dir, settings):
    settings.PANTHEON_MODELS = [
        {"name": "seeded", "path": str(model_dir / "tiny.gguf"), "ctx_cap": 32, "max_sessions": 1}
    ]
    rt = restart()
    try:
        assert set(rt.services()) == {"seeded"}
        row = ServedModel.objects.get(name="seeded")
        assert (row.should_load, row.ctx_cap, row.max_sessions) == (True, 32, 1)
    finally:
        rt.close()


def test_a_failed_start_up_load_is_recorded_and_the_others_load(transactional_db, model_dir):
    ServedModel.objects.create(name="gone", path=str(model_dir / "gone.gguf"), should_load=True)
    ServedModel.objects.create(name="good", path=str(model_dir / "tiny.gguf"), should_load=True)
    rt = restart()
    try:
        assert set(rt.services()) == {"good"}
        assert rt.states()["gone"].state == FAILED
        row = ServedModel.objects.get(name="gone")
        assert "not found" in row.last_error
        assert row.should_load  # tried again at the next start, unless unloaded
    finally:
        rt.close()


def test_a_row_moved_outside_the_model_folders_is_refused_at_start(transactional_db, model_dir):
    ServedModel.objects.create(name="escaped", path="/etc/passwd", should_load=True)
    rt = restart()
    try:
        assert rt.states()["escaped"].state == FAILED
        assert "outside the model folders" in ServedModel.objects.get(name="escaped").last_error
    finally:
        rt.close()


class UnreadableStore(Store):
    def startup(self, seed):
        raise RuntimeError("no such table: operators_servedmodel")


def test_an_unreadable_store_falls_back_to_pantheon_models(model_dir, settings, caplog):
    settings.PANTHEON_MODELS = [{"name": "env", "path": str(model_dir / "tiny.gguf")}]
    rt = Runtime(UnreadableStore())
    rt.start_loading()
    try:
        assert rt.wait_loaded(30)
        assert set(rt.services()) == {"env"}
        assert "cannot read the model store" in caplog.text
    finally:
        rt.close()


def test_requests_during_start_up_are_told_to_retry():
    from pantheon_platform.runtime import NoModelsLoaded

    rt = Runtime()
    rt._starting = True  # the loader has not read the store yet
    with pytest.raises(NoModelsLoaded, match="starting"):
        rt.resolve(None)
