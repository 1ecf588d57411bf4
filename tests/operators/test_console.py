"""The operator console (Django admin at /console/), in-process: live status columns, the
load / unload / pin / unpin actions, the load-a-file form, aliases and the dies page."""

from __future__ import annotations

import pytest
from django.test import Client

from operators.models import Alias, ServedModel
from pantheon_platform.runtime import LoadSpec

CHANGELIST = "/console/operators/servedmodel/"
LOAD_FILE = CHANGELIST + "load-file/"


@pytest.fixture
def console(db_rt, django_user_model) -> Client:
    """A logged-in operator."""
    user = django_user_model.objects.create_superuser("op", "op@example.com", "unused-pw")
    client = Client()
    client.force_login(user)
    return client


def action(console: Client, name: str, *rows: ServedModel):
    return console.post(
        CHANGELIST, {"action": name, "_selected_action": [r.pk for r in rows]}, follow=True
    )


def messages_of(response) -> list[str]:
    return [str(m) for m in response.context["messages"]]


def test_the_console_needs_a_login():
    response = Client().get(CHANGELIST)
    assert response.status_code == 302 and "/console/login/" in response["Location"]


def test_the_change_list_shows_live_status(console, db_rt, model_dir):
    db_rt.load(LoadSpec.of(name="chat", path="tiny.gguf", ctx_cap=100_000))
    ServedModel.objects.create(name="idle", path=str(model_dir / "other.gguf"))
    ServedModel.objects.create(
        name="broken", path=str(model_dir / "x.gguf"), last_error="model file not found: x.gguf"
    )
    page = console.get(CHANGELIST).content.decode()
    assert "Load a model file" in page and "Dies" in page
    page = page.lower()  # the admin capitalises column headers
    for text in [
        "loaded",
        "not loaded",
        "last error: model file not found: x.gguf",
        "256 / 100000",  # context window served / configured
        "kib",  # memory
        "context window (served / configured)",
        "in flight",
        "sessions",
        "draft acceptance",
    ]:
        assert text in page, text


def test_load_unload_pin_and_unpin_actions(console, db_rt, model_dir):
    row = ServedModel.objects.create(name="chat", path=str(model_dir / "tiny.gguf"))

    assert "Loaded chat." in messages_of(action(console, "load_selected", row))
    assert set(db_rt.services()) == {"chat"}
    action(console, "pin_selected", row)
    assert db_rt.instance("chat").pinned and ServedModel.objects.get(pk=row.pk).pinned
    action(console, "unpin_selected", row)
    assert not db_rt.instance("chat").pinned

    assert "Unloaded chat." in messages_of(action(console, "unload_selected", row))
    assert db_rt.services() == {}
    assert ServedModel.objects.get(pk=row.pk).should_load is False
    # Pinning a model that is not loaded applies at its next load.
    action(console, "pin_selected", row)
    assert ServedModel.objects.get(pk=row.pk).pinned


def test_a_failing_load_action_says_why(console, db_rt, model_dir):
    row = ServedModel.objects.create(name="gone", path=str(model_dir / "gone.gguf"))
    [message] = messages_of(action(console, "load_selected", row))
    assert message.startswith("gone: model file not found")
    assert "not found" in ServedModel.objects.get(pk=row.pk).last_error


def test_the_load_form_offers_the_model_files_and_loads_one(console, db_rt, model_dir):
    page = console.get(LOAD_FILE)
    assert page.status_code == 200
    html = page.content.decode()
    assert str(model_dir / "tiny.gguf") in html and str(model_dir / "other.gguf") in html

    response = console.post(
        LOAD_FILE,
        {"file": str(model_dir / "other.gguf"), "name": "web", "ctx_cap": 64},
        follow=True,
    )
    assert "Loaded web." in messages_of(response)
    assert db_rt.services()["web"].context_window == 64
    assert ServedModel.objects.get(name="web").should_load


def test_the_load_form_takes_a_chat_template(console, db_rt, model_dir):
    template = "{% for m in messages %}<think>{{ m.content }}{% endfor %}"
    response = console.post(
        LOAD_FILE,
        {"file": str(model_dir / "tiny.gguf"), "name": "templated", "chat_template": template},
        follow=True,
    )
    assert "Loaded templated." in messages_of(response)
    assert db_rt.services()["templated"].template.source == template
    assert ServedModel.objects.get(name="templated").chat_template == template
    response = console.post(
        LOAD_FILE, {"file": str(model_dir / "tiny.gguf"), "chat_template": "{% if %}"}
    )
    assert "template" in response.content.decode()


def test_the_load_form_refuses_files_it_did_not_offer_and_shows_load_errors(
    console, db_rt, model_dir, settings
):
    response = console.post(LOAD_FILE, {"file": "/etc/passwd"})
    assert "Select a valid choice" in response.content.decode()
    settings.PANTHEON_MEMORY_RESERVE_BYTES = 1 << 60
    response = console.post(LOAD_FILE, {"file": str(model_dir / "tiny.gguf")})
    assert "not enough memory" in response.content.decode()
    assert db_rt.services() == {}


def test_a_config_path_outside_the_model_folders_is_refused(console, db_rt, model_dir):
    response = console.post(
        CHANGELIST + "add/",
        {
            "name": "evil",
            "path": "/etc/passwd",
            "ctx_cap": 0,
            "max_sessions": 4,
            "max_concurrent": 0,
            "reasoning_budget": 0,
        },
    )
    assert "outside the model folders" in response.content.decode()
    assert not ServedModel.objects.exists()


def test_a_loaded_model_cannot_be_deleted(console, db_rt, model_dir):
    db_rt.load(LoadSpec.of(name="chat", path="tiny.gguf"))
    row = ServedModel.objects.get(name="chat")
    assert console.get(f"{CHANGELIST}{row.pk}/delete/").status_code == 403


def test_aliases_go_through_the_registry(console, db_rt, model_dir):
    db_rt.load(LoadSpec.of(name="chat", path="tiny.gguf"))
    response = console.post("/console/operators/alias/add/", {"alias": "gpt-4o", "target": "chat"})
    assert response.status_code == 302
    assert db_rt.resolve("gpt-4o")[0] == "chat"
    assert Alias.objects.get(alias="gpt-4o").target == "chat"

    response = console.post("/console/operators/alias/add/", {"alias": "x", "target": "x"})
    assert "cannot point at itself" in response.content.decode()
    response = console.post("/console/operators/alias/add/", {"alias": "chat", "target": "x"})
    assert "loaded model" in response.content.decode()

    listing = console.get("/console/operators/alias/").content.decode().lower()
    assert "gpt-4o" in listing and "resolves to" in listing
    alias = Alias.objects.get(alias="gpt-4o")
    console.post(f"/console/operators/alias/{alias.pk}/delete/", {"post": "yes"})
    assert db_rt.aliases() == {} and not Alias.objects.exists()


def test_the_dies_page(console, db_rt):
    import kernels

    page = console.get(CHANGELIST + "dies/").content.decode()
    n = kernels.dies_visible()
    assert f"{n} accelerator die" in page
    if n == 0:
        assert "runs on the host CPU" in page
