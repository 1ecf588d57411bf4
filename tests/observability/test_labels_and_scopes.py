"""What /metrics may show and to whom: no client text in any label, the `metrics` scope."""

from __future__ import annotations

import pytest

from tests.access.asgi_raw import request, stack_app
from tests.conftest import SMOLLM2_NAME as MODEL
from tests.observability.helpers import ADMIN_KEY, CLIENT_KEY, bearer, stats

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.anyio]

MARKER = "zq7marker"


async def test_labels_never_carry_user_text(served):
    """A client's text in the path, the model field, the body, a session id and an unknown
    route reaches no label: routes are URL patterns, models the served names."""
    app = stack_app()
    said = {"role": "user", "content": f"Repeat {MARKER}."}
    body = {"model": MARKER, "messages": [said], "max_tokens": 2, MARKER: 1}
    sent = [
        await request(app, "POST", "/v1/chat/completions", body),  # any model: the one served
        await request(
            app, "POST", "/v1/chat/completions", {**body, "stream": True},
            headers={"x-session-id": MARKER},
        ),
        await request(app, "POST", "/v1/completions", {"model": MARKER, "prompt": MARKER, "max_tokens": 2}),
        await request(app, "POST", f"/v1/chat/completions/{MARKER}", body),
        await request(app, "GET", f"/v1/models/{MARKER}"),
        await request(app, "GET", f"/{MARKER}/metrics"),
        await request(app, "POST", "/api/chat", {"model": MARKER, "messages": "bad"}),
    ]  # fmt: skip
    assert [r.status for r in sent] == [200, 200, 200, 404, 404, 404, 400]
    exposition = (await request(app, "GET", "/metrics")).body.decode()
    assert "pantheon_requests_total" in exposition and MODEL in exposition
    assert MARKER not in exposition
    assert 'route="unmatched"' in exposition
    assert 'route="/v1/models/<path:model_id>"' in exposition
    rows = await stats(app, key=None)
    assert rows and MARKER not in repr(rows)


@pytest.fixture
def env_keys(settings):
    from access import keys

    settings.PANTHEON_API_KEY = CLIENT_KEY
    settings.PANTHEON_ADMIN_API_KEY = ADMIN_KEY
    keys.forget_cache()
    yield
    keys.forget_cache()


async def test_metrics_need_the_metrics_scope_once_keys_are_set(env_keys, empty_runtime):
    app = stack_app()
    assert (await request(app, "GET", "/metrics")).error(401, "invalid_api_key")
    refused = await request(app, "GET", "/metrics", headers=bearer(CLIENT_KEY))
    assert "'metrics' scope" in refused.error(403, "insufficient_scope")
    assert (await request(app, "GET", "/metrics", headers=bearer(ADMIN_KEY))).status == 200


async def test_a_console_key_with_only_the_metrics_scope_reads_metrics_and_nothing_else(
    empty_runtime,
):
    from access import keys
    from access.models import ApiKey

    key = keys.generate()
    await ApiKey.objects.acreate(
        name="prometheus", prefix=key[:10], key_hash=keys.digest(key), scopes=["metrics"]
    )
    keys.forget_cache()
    app = stack_app()
    assert (await request(app, "GET", "/metrics", headers=bearer(key))).status == 200
    for path in ("/admin/stats", "/v1/models"):
        refused = await request(app, "GET", path, headers=bearer(key))
        refused.error(403, "insufficient_scope")
    keys.forget_cache()


async def test_metrics_off_count_nothing_and_the_route_is_404(settings, served):
    from observability import metrics

    settings.PANTHEON_METRICS = False
    app = stack_app()
    counter = metrics.REQUESTS.labels("/v1/chat/completions", "200")
    before = counter._value.get()
    body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}
    assert (await request(app, "POST", "/v1/chat/completions", body)).status == 200
    assert counter._value.get() == before
    (await request(app, "GET", "/metrics")).error(404, "not_found")


async def test_metrics_answer_get_only(empty_runtime):
    app = stack_app()
    refused = await request(app, "POST", "/metrics", {})
    refused.error(405, "method_not_allowed")
    assert refused.headers["allow"] == "GET, OPTIONS"


async def test_a_429_from_the_key_quota_is_counted_under_its_reason(settings, env_keys, served):
    import asyncio

    from observability import metrics
    from tests.conftest import SMOLLM2_NAME

    settings.PANTHEON_KEY_MAX_CONCURRENT = 1
    app = stack_app()
    rejected = metrics.REJECTIONS.labels("key_concurrency_exceeded")
    before = rejected._value.get()
    svc = served.services()[SMOLLM2_NAME]
    body = {"messages": [{"role": "user", "content": "Count to 100."}], "max_tokens": 48}
    first = asyncio.create_task(
        request(app, "POST", "/v1/chat/completions", body, headers=bearer(CLIENT_KEY))
    )
    while not svc.in_flight and not first.done():  # the first holds the key's one place
        await asyncio.sleep(0.005)
    second = await request(app, "GET", "/v1/models", headers=bearer(CLIENT_KEY))
    second.error(429, "key_concurrency_exceeded")
    assert (await first).status == 200
    assert rejected._value.get() == before + 1
