"""Speculative decoding in /metrics and /admin/models: per model, the tokens drafted and
the drafted tokens accepted (the engine's own counters, read at each scrape), and the
acceptance rate on the operator's row."""

from __future__ import annotations

import importlib.util

import pytest

from engine.types import ModelConfig
from operators.rows import speculation_json
from tests.access.asgi_raw import request, stack_app
from tests.conftest import SMOLLM2_NAME as MODEL
from tests.observability.helpers import moved, scrape

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.anyio]

ENGINE_DRAFTS = importlib.util.find_spec("engine.serving.speculation") is not None
DRAFTED = "pantheon_speculative_draft_tokens_total"
ACCEPTED = "pantheon_speculative_accepted_tokens_total"
ASK = [{"role": "user", "content": "Count from one to twenty in words, separated by commas."}]


@pytest.fixture
def counted(served, smollm2_service):
    """SmolLM2 again as "counted": its own engine loop, so its own counters."""
    svc = smollm2_service.sibling(ModelConfig(name="counted", path=smollm2_service.path))
    served.register("counted", svc)
    yield svc
    served.unregister("counted")
    svc.close()


async def test_the_counters_are_the_engines_per_model(counted):
    app = stack_app()
    counted.stats.drafted_tokens, counted.stats.accepted_draft_tokens = 40, 30
    scraped = await scrape(app, key=None)
    assert scraped[(DRAFTED, frozenset({("model", "counted")}))] == 40
    assert scraped[(ACCEPTED, frozenset({("model", "counted")}))] == 30
    for name in (DRAFTED, ACCEPTED):
        assert scraped[(name, frozenset({("model", MODEL)}))] >= 0
    assert speculation_json(counted) == {
        "mode": "auto",
        "drafted_tokens": 40,
        "accepted_tokens": 30,
        "acceptance_rate": 0.75,
        "draft_model": None,
    }


async def test_the_models_row_shows_the_acceptance_rate(counted):
    app = stack_app()
    response = await request(app, "GET", "/admin/models")
    assert response.status == 200, response.body
    rows = {row["id"]: row for row in response.json()["data"]}
    # Nothing drafted yet: no rate to show.
    assert rows["counted"]["speculation"] == {
        "mode": "auto",
        "drafted_tokens": 0,
        "accepted_tokens": 0,
        "acceptance_rate": None,
        "draft_model": None,
    }
    counted.stats.drafted_tokens, counted.stats.accepted_draft_tokens = 8, 2
    rows = {row["id"]: row for row in (await request(app, "GET", "/admin/models")).json()["data"]}
    assert rows["counted"]["speculation"]["acceptance_rate"] == 0.25


async def test_a_predicted_answer_moves_the_counters(counted):
    app = stack_app()
    body = {"model": "counted", "messages": ASK, "temperature": 0, "max_tokens": 32}
    plain = await request(app, "POST", "/v1/chat/completions", body)
    assert plain.status == 200, plain.body
    answer = plain.json()["choices"][0]["message"]["content"]
    before = await scrape(app, key=None)
    prediction = {"type": "content", "content": answer}
    predicted = await request(
        app, "POST", "/v1/chat/completions", {**body, "prediction": prediction}
    )
    assert predicted.status == 200, predicted.body
    after = await scrape(app, key=None)
    drafted = moved(before, after, DRAFTED, model="counted")
    accepted = moved(before, after, ACCEPTED, model="counted")
    assert 0 <= accepted <= drafted
    assert predicted.json()["choices"][0]["message"]["content"] == answer
    if not ENGINE_DRAFTS:
        pytest.skip("the engine does not draft yet: its counters stay at 0")
    details = predicted.json()["usage"]["completion_tokens_details"]
    assert accepted >= details["accepted_prediction_tokens"] > 0
