"""The console's dashboard, in-process: the index page carries it, its data route is behind
the console login and answers bad input in the error shape, lists each model with its
points (the sampler on the real metrics registry), a loading model's progress (a real
load, looked at from its own progress hook) and the usage per key."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from django.test import Client

from observability import dashboard, series
from observability.metrics import GENERATED_TOKENS, REGISTRY
from observability.models import HOUR, UsageBucket
from observability.usage import hour_of
from pantheon_platform.runtime import LoadSpec
from tests.conftest import SMOLLM2_NAME
from tests.tiny_gguf import write_tiny_llama

DATA = "/console/dashboard.json"


@pytest.fixture
def console(db, django_user_model) -> Client:
    user = django_user_model.objects.create_superuser("op", "op@example.com", "unused-pw")
    client = Client()
    client.force_login(user)
    return client


def test_the_console_index_is_the_dashboard(console):
    page = console.get("/console/").content.decode()
    assert 'id="dashboard"' in page and f'data-url="{DATA}"' in page
    assert "observability/dashboard.js" in page
    assert "Model configs" in page  # the admin's app list stays below it


def test_the_data_route_needs_the_console_login(db):
    response = Client().get(DATA)
    assert response.status_code == 302 and "/console/login/" in response["Location"]


@pytest.mark.parametrize("since", ["yesterday", "nan", "inf", "-1"])
def test_a_bad_since_is_a_400_naming_it(console, since):
    response = console.get(DATA, {"since": since})
    assert response.status_code == 400
    assert response.json()["error"]["param"] == "since"


def test_only_get_is_allowed(console):
    response = console.post(DATA)
    assert response.status_code == 405 and response.json()["error"]["type"]


def test_a_loaded_model_has_its_points(console, served, monkeypatch):
    sampler = series.Sampler(REGISTRY)
    monkeypatch.setattr(series, "_sampler", sampler)
    sampler.sample(now=1000.0, mono=0.0)
    GENERATED_TOKENS.labels(SMOLLM2_NAME).inc(30)
    sampler.sample(now=1002.0, mono=2.0)

    body = console.get(DATA).json()
    assert body["sampling"] is True
    (row,) = body["models"]
    assert row["name"] == SMOLLM2_NAME and row["state"] == "loaded"
    assert row["in_flight"] == 0 and row["memory_bytes"] > 0
    points = row["series"]
    assert points["t"] == [1002.0] and points["tokens_per_s"] == [15.0]
    assert points["kv_capacity"][0] > 0  # the runtime's gauges, read at the sample
    assert console.get(DATA, {"since": 1002}).json()["models"][0]["series"]["t"] == []


def test_a_loading_model_shows_its_progress(empty_runtime, tmp_path, settings):
    folder = tmp_path.resolve()
    write_tiny_llama(folder / "tiny.gguf", n_layer=4)
    settings.PANTHEON_MODEL_DIRS = [folder]
    seen: list[dict] = []
    # On the loading thread, after each step: what the dashboard would answer now.
    empty_runtime.add_progress_hook(
        lambda name, p: seen.append(dashboard.model_rows(empty_runtime, {})[0])
    )
    empty_runtime.load(LoadSpec.of(name="tiny", path=str(folder / "tiny.gguf")))
    try:
        assert {row["state"] for row in seen} == {"loading"}
        fractions = [row["progress"]["fraction"] for row in seen]
        assert fractions == sorted(fractions) and fractions[0] < 1 and fractions[-1] == 1
        assert {"phase", "tensors_done", "tensors_total", "bytes_done"} <= set(seen[-1]["progress"])
        (row,) = dashboard.model_rows(empty_runtime, {})
        assert row["state"] == "loaded" and "progress" not in row
    finally:
        empty_runtime.close()


def test_usage_per_key_sums_the_last_day_by_key_and_model(db):
    now = datetime(2025, 6, 1, 12, 30, tzinfo=UTC)

    def bucket(key, model, hours_ago, requests, generated):
        UsageBucket.objects.create(
            key=key,
            model=model,
            span=HOUR,
            start=hour_of(now) - timedelta(hours=hours_ago),
            requests=requests,
            generated_tokens=generated,
        )

    bucket("env:client", "a", 0, 2, 20)
    bucket("env:client", "a", 5, 1, 7)
    bucket("", "a", 1, 4, 1)
    bucket("env:client", "a", 24, 100, 100)  # a day ago: outside
    usage = dashboard.usage_per_key(now)
    assert [
        (r["key"], r["model"], r["requests"], r["generated_tokens"]) for r in usage["rows"]
    ] == [
        ("(no key)", "a", 4, 1),
        ("env:client", "a", 3, 27),
    ]
