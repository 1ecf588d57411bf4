"""GET /admin/stats: its parameters, its groupings, and the bounds on what is kept."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from observability import usage
from observability.models import DAY, HOUR, UsageBucket
from tests.access.asgi_raw import request, stack_app

NOW = datetime(2026, 3, 10, 15, 30, tzinfo=UTC)


def bucket(span: str, start: datetime, key: str = "k", model: str = "m", **counts) -> UsageBucket:
    return UsageBucket.objects.create(key=key, model=model, span=span, start=start, **counts)


@pytest.mark.django_db
def test_old_hours_roll_up_into_days_and_old_days_are_dropped(settings):
    settings.PANTHEON_STATS_RETENTION_DAYS = 7
    settings.PANTHEON_STATS_DAYS_KEPT = 30
    old_day = datetime(2026, 2, 20, tzinfo=UTC)
    bucket(HOUR, old_day.replace(hour=3), requests=2, prompt_tokens=10, generated_tokens=4)
    bucket(HOUR, old_day.replace(hour=9), requests=1, prompt_tokens=5, errors=1)
    bucket(HOUR, old_day.replace(hour=9), key="other", requests=7)
    bucket(DAY, old_day, requests=100)  # rolled up earlier: the hours add to it
    recent = bucket(HOUR, NOW.replace(minute=0) - timedelta(days=2), requests=3)
    bucket(DAY, datetime(2026, 1, 1, tzinfo=UTC), requests=9)  # past PANTHEON_STATS_DAYS_KEPT

    usage.prune(NOW)

    rows = {(r.key, r.span, r.start): r for r in UsageBucket.objects.all()}
    assert set(rows) == {("k", DAY, old_day), ("other", DAY, old_day), ("k", HOUR, recent.start)}
    day = rows[("k", DAY, old_day)]
    assert (day.requests, day.prompt_tokens, day.generated_tokens, day.errors) == (103, 15, 4, 1)
    assert rows[("other", DAY, old_day)].requests == 7


@pytest.mark.django_db
def test_a_failed_write_keeps_the_counts_for_the_next_flush(monkeypatch, caplog):
    from observability import usage as module

    usage.flush()  # whatever earlier tests left
    usage.add("k", "m", usage.Counts(requests=1, prompt_tokens=5), when=NOW)

    def broken(*args, **kwargs):
        raise module.transaction.DatabaseError("disk full")

    monkeypatch.setattr(module, "_add_to_row", broken)
    assert usage.flush_quietly() is False
    assert "usage stats: the write failed" in caplog.text
    monkeypatch.undo()
    usage.add("k", "m", usage.Counts(requests=1, generated_tokens=2), when=NOW)
    assert usage.flush() == 1
    row = UsageBucket.objects.get(key="k", model="m")
    assert (row.requests, row.prompt_tokens, row.generated_tokens) == (2, 5, 2)
    assert row.start == NOW.replace(minute=0) and row.span == HOUR


@pytest.fixture
def stored(transactional_db):
    usage.flush()  # whatever earlier tests left, written before the rows below
    UsageBucket.objects.all().delete()
    h = NOW.replace(minute=0)
    bucket(HOUR, h, key="a", model="m1", requests=1, prompt_tokens=10, cached_tokens=2)
    bucket(HOUR, h + timedelta(hours=1), key="a", model="m2", requests=2, generated_tokens=6)
    bucket(HOUR, h + timedelta(hours=1), key="b", model="m1", requests=4, errors=1)
    bucket(DAY, datetime(2026, 3, 1, tzinfo=UTC), key="a", model="m1", requests=50)


async def get_stats(query: str):
    return await request(stack_app(), "GET", "/admin/stats", query=query)


@pytest.mark.anyio
async def test_stats_group_by_key_model_hour_and_day(stored):
    body = (await get_stats("group_by=key")).json()
    assert body["object"] == "list" and body["group_by"] == ["key"]
    assert [(r["key"], r["requests"]) for r in body["data"]] == [("a", 53), ("b", 4)]
    first = body["data"][0]
    assert (first["prompt_tokens"], first["cached_tokens"], first["completion_tokens"]) == (
        10,
        2,
        6,
    )

    body = (await get_stats("group_by=model,day&from=2026-03-10T00:00:00Z")).json()
    assert body["from"] == "2026-03-10T00:00:00Z" and body["to"] is None
    assert [(r["model"], r["day"], r["requests"], r["errors"]) for r in body["data"]] == [
        ("m1", "2026-03-10T00:00:00Z", 5, 1),
        ("m2", "2026-03-10T00:00:00Z", 2, 0),
    ]

    start = int(NOW.replace(minute=0).timestamp())
    body = (await get_stats(f"group_by=hour&from={start}&to={start + 3600}")).json()
    assert body["data"] == [
        {"hour": "2026-03-10T15:00:00Z", "requests": 1, "prompt_tokens": 10,
         "cached_tokens": 2, "completion_tokens": 0, "errors": 0},
    ]  # fmt: skip

    body = (await get_stats("group_by=&from=2026-03-10T16:00:00%2B01:00")).json()  # 15:00Z
    assert body["group_by"] == [] and body["from"] == "2026-03-10T15:00:00Z"
    assert [(r["requests"], r["errors"]) for r in body["data"]] == [(7, 1)]

    body = (await get_stats("")).json()  # default: by key and model
    assert body["group_by"] == ["key", "model"]
    assert [(r["key"], r["model"], r["requests"]) for r in body["data"]] == [
        ("a", "m1", 51), ("a", "m2", 2), ("b", "m1", 4),
    ]  # fmt: skip


@pytest.mark.anyio
@pytest.mark.parametrize(
    "query, param",
    [
        ("from=yesterday", "from"),
        ("to=2026-13-01", "to"),
        ("from=0001-01-01T00:00:00%2B05:00", "from"),
        ("from=1e400", "from"),
        ("from=2026-03-10T12:00:00Z&to=2026-03-10T11:00:00Z", "to"),
        ("group_by=key,week", "group_by"),
        ("group_by=key,key", "group_by"),
    ],
)
async def test_bad_parameters_are_a_400_naming_the_field(transactional_db, query, param):
    raw = await get_stats(query)
    message = raw.error(400, "invalid_request_error")
    assert raw.json()["error"]["param"] == param and param in message
