"""Runtime config: GET /admin/config lists every setting (live and read-only); PATCH
checks, stores and applies live ones from the next request on, audits them on the access
log, and what it stored is read back after a restart (a fresh process's start-up read).

The queue depth is proven with real requests on the session's SmolLM2 (one slot): after
a PATCH to 0 the next request is refused 429 server_busy; after a PATCH to 1 it queues."""

from __future__ import annotations

import asyncio
import json
import logging

import pytest

from engine.types import ModelConfig
from operators.models import ConfigOverride
from pantheon_platform import live_settings
from pantheon_platform.runtime import LoadSpec, Runtime
from tests.access.asgi_raw import request, stack_app
from tests.conftest import SMOLLM2_NAME
from tests.wire.helpers import CHAT, HELLO, AsgiCall

LONG = [{"role": "user", "content": "Count from 1 to 1000, separated by commas."}]


@pytest.fixture(autouse=True)
def fresh_config():
    """Each test starts from the environment's values and leaves them so (the database
    rows go with the test's database)."""
    live_settings.forget()
    yield
    live_settings.forget()


@pytest.fixture
def app():
    return stack_app()


async def patch(app, body) -> object:
    return await request(app, "PATCH", "/admin/config", body)


def chat(**fields) -> bytes:
    return json.dumps({"temperature": 0, **fields}).encode()


async def wait_until(predicate, timeout: float = 60) -> None:
    async def poll():
        while not predicate():
            await asyncio.sleep(0.02)

    await asyncio.wait_for(poll(), timeout)


@pytest.mark.django_db
def test_get_lists_live_settings_with_their_source_and_read_only_ones(settings, api):
    settings.PANTHEON_MAX_LOADED_MODELS = 3
    body = api.get("/admin/config").json()
    assert body["object"] == "config"
    rows = body["settings"]
    assert set(live_settings.SETTINGS) <= set(rows)
    depth = rows["queue_depth"]
    assert depth["mutable"] is True and depth["source"] == "environment"
    assert depth["value"] == depth["default"] == settings.PANTHEON_ENGINE_OPTIONS["queue_depth"]
    assert depth["env"] == "BS_QUEUE_DEPTH" and depth["applies"] == "next request"
    assert rows["max_loaded_models"]["value"] == 3  # read live from the environment's setting
    assert rows["backend"]["mutable"] is False and rows["backend"]["env"] == "PANTHEON_BACKEND"
    assert rows["model_dirs"]["value"] == [str(p) for p in settings.PANTHEON_MODEL_DIRS]
    read_only = {n for n, r in rows.items() if not r["mutable"]}
    assert read_only and not read_only & set(live_settings.SETTINGS)


@pytest.mark.anyio
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize(
    ("body", "field", "says"),
    [
        ({"queue_depth": -1}, "queue_depth", "expected an integer from 0 to 100000"),
        ({"queue_depth": "4"}, "queue_depth", "expected an integer"),
        ({"queue_depth": True}, "queue_depth", "expected an integer"),
        ({"queue_timeout_s": 10**400}, "queue_timeout_s", "expected a number"),
        ({"log_level": "LOUD"}, "log_level", "expected one of DEBUG, INFO, WARNING, ERROR"),
        ({"tool_grammar": None, "no_think": "yes"}, "no_think", "expected true or false"),
        ({"queue_depth": 4, "max_loaded_models": 0}, "max_loaded_models", "from 1 to 1000"),
        ({"colour": "blue"}, "colour", "no such setting"),
        ({"backend": "numpy"}, "backend", "set PANTHEON_BACKEND and restart the server"),
    ],
)
async def test_a_bad_patch_is_a_400_naming_the_field_and_changes_nothing(app, body, field, says):
    before = (await request(app, "GET", "/admin/config")).json()
    response = await patch(app, body)
    message = response.error(400, "invalid_request_error")
    assert message.startswith(f"{field}: ") and says in message, message
    assert response.json()["error"]["param"] == field
    assert (await request(app, "GET", "/admin/config")).json() == before
    assert not await asyncio.to_thread(ConfigOverride.objects.exists)


@pytest.mark.anyio
@pytest.mark.django_db(transaction=True)
@pytest.mark.parametrize("body", [{}, [], b"", b"{", b'"queue_depth"'])
async def test_a_patch_that_is_not_a_settings_object_is_a_400(app, body):
    (await patch(app, body)).error(400, "invalid_request_error")


@pytest.mark.anyio
@pytest.mark.django_db(transaction=True)
async def test_a_patched_queue_depth_refuses_the_next_request_without_a_restart(
    app, empty_runtime, smollm2_service
):
    svc = smollm2_service.sibling(
        ModelConfig(name=SMOLLM2_NAME, path=smollm2_service.path, max_concurrent=1)
    )
    empty_runtime.register(SMOLLM2_NAME, svc)
    django_app = __import__("django.core.asgi", fromlist=["x"]).get_asgi_application()
    running = AsgiCall(django_app, CHAT, chat(messages=LONG, max_tokens=400, stream=True))
    try:
        running.start()
        await running.wait_for(lambda c: b'"content"' in b"".join(c.chunks), timeout=120)

        ok = await patch(app, {"queue_depth": 0})
        assert ok.status == 200, ok.body
        assert ok.json()["settings"]["queue_depth"] == {
            **ok.json()["settings"]["queue_depth"],
            "value": 0,
            "source": "database",
        }
        refused = AsgiCall(django_app, CHAT, chat(messages=HELLO, max_tokens=2)).start()
        await asyncio.wait_for(refused.task, 30)
        assert refused.status == 429  # the slot is busy and no request may wait
        assert json.loads(b"".join(refused.chunks))["error"]["type"] == "server_busy"

        assert (await patch(app, {"queue_depth": 1})).status == 200
        queued = AsgiCall(django_app, CHAT, chat(messages=HELLO, max_tokens=2)).start()
        await wait_until(lambda: svc.queued == 1)  # it waits instead of a 429
        over = AsgiCall(django_app, CHAT, chat(messages=HELLO, max_tokens=2)).start()
        await asyncio.wait_for(over.task, 30)
        assert over.status == 429

        running.hang_up.set()  # the slot frees: the queued request is answered
        await asyncio.wait_for(queued.task, 120)
        assert queued.status == 200
    finally:
        running.hang_up.set()
        await asyncio.wait_for(running.task, 30)
        empty_runtime.unregister(SMOLLM2_NAME)
        svc.close()


@pytest.mark.anyio
@pytest.mark.django_db(transaction=True)
async def test_a_patch_is_audited_on_its_access_log_line(app):
    lines = AccessLines()
    with lines:
        assert (await patch(app, {"queue_depth": 3, "log_level": "INFO"})).status == 200
        assert (await patch(app, {"queue_depth": None})).status == 200
    first, second = [x for x in lines.parsed() if x["route"] == "/admin/config"]
    default = live_settings.default("queue_depth")
    # Only what moved: log_level was INFO already.
    assert first["config"] == {"queue_depth": [default, 3]} and first["method"] == "PATCH"
    assert second["config"] == {"queue_depth": [3, default]}


@pytest.mark.django_db(transaction=True)
def test_what_a_patch_stored_is_read_back_by_a_fresh_process(api, model_dir):
    assert api_patch(api, {"queue_depth": 2, "queue_timeout_s": 7, "max_loaded_models": 1})
    assert ConfigOverride.objects.get(name="queue_depth").value == 2

    live_settings.forget()  # the process is gone: only the database remembers
    assert live_settings.value("queue_depth") == live_settings.default("queue_depth")
    live_settings.refresh()  # what pantheon_site.asgi does at start
    assert live_settings.value("queue_depth") == 2
    assert api.get("/admin/config").json()["settings"]["queue_depth"]["source"] == "database"

    # A new registry's loads get the stored values: the queue, and one model at a time.
    from operators.store import DatabaseStore

    rt = Runtime(DatabaseStore())
    try:
        rt.load(LoadSpec.of(name="a", path="tiny.gguf"))
        assert rt.instance("a").svc.scheduler.queue_depth == 2
        assert rt.instance("a").svc.scheduler.queue_timeout_s == 7.0
        rt.load(LoadSpec.of(name="b", path="other.gguf"))  # evicts a: max_loaded_models 1
        assert [i.name for i in rt.instances()] == ["b"]
    finally:
        rt.close()


@pytest.mark.django_db(transaction=True)
def test_a_stored_value_this_version_refuses_is_ignored_at_start(caplog):
    ConfigOverride.objects.create(name="queue_depth", value=-5)
    ConfigOverride.objects.create(name="retired_setting", value=1)
    live_settings.refresh()
    assert live_settings.value("queue_depth") == live_settings.default("queue_depth")
    assert not live_settings.overridden("retired_setting")


@pytest.mark.django_db(transaction=True)
def test_the_read_sites_follow_the_live_values(api):
    from access.keys import Principal, max_concurrent_for
    from pantheon_platform.chat_http import chat_options
    from pantheon_platform.runtime import default_options

    assert api_patch(
        api,
        {
            "no_think": True,
            "tool_grammar": "off",
            "key_max_concurrent": 3,
            "reasoning_budget": 64,
            "log_level": "DEBUG",
        },
    )
    options = chat_options()
    assert options.no_think is True and options.tool_grammar is False
    assert max_concurrent_for(Principal(label="k", identity="k", scopes=frozenset())) == 3
    assert default_options()["reasoning_budget"] == 64
    assert logging.getLogger("pantheon").getEffectiveLevel() == logging.DEBUG

    assert api_patch(api, {"tool_grammar": "auto", "log_level": None})
    assert chat_options().tool_grammar is True
    assert logging.getLogger("pantheon").getEffectiveLevel() == logging.INFO


def api_patch(api, body: dict) -> bool:
    response = api.client.patch(
        "/admin/config", data=json.dumps(body), content_type="application/json"
    )
    assert response.status_code == 200, response.content
    return True


class AccessLines(logging.Handler):
    """The lines on `pantheon.access` (its own handler: the logger does not propagate)."""

    def __init__(self):
        super().__init__(logging.INFO)
        self.records: list[str] = []
        self.logger = logging.getLogger("pantheon.access")

    def emit(self, record):
        self.records.append(record.getMessage())

    def parsed(self) -> list[dict]:
        return [json.loads(r) for r in self.records]

    def __enter__(self):
        self.logger.addHandler(self)
        return self

    def __exit__(self, *exc):
        self.logger.removeHandler(self)
