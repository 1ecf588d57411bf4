"""Scraping /metrics and reading /admin/stats through the whole ASGI stack."""

from __future__ import annotations

import json

from prometheus_client.parser import text_string_to_metric_families

from tests.access.asgi_raw import request

CLIENT_KEY = "client-key-for-the-metrics-tests"
ADMIN_KEY = "admin-key-for-the-metrics-tests"


def bearer(key: str) -> dict[str, str]:
    return {"authorization": f"Bearer {key}"}


async def scrape(app, key: str | None = ADMIN_KEY) -> dict:
    """{(sample name, frozenset of labels): value} of one GET /metrics."""
    raw = await request(app, "GET", "/metrics", headers=bearer(key) if key else None)
    assert raw.status == 200, raw.body[:300]
    assert raw.headers["content-type"].startswith("text/plain")
    return parse(raw.body.decode())


def parse(text: str) -> dict:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def moved(before: dict, after: dict, name: str, **labels) -> float:
    """How far one series moved between two scrapes (absent: 0)."""
    key = (name, frozenset(labels.items()))
    return after.get(key, 0.0) - before.get(key, 0.0)


async def stats(app, query: str = "", key: str | None = ADMIN_KEY) -> dict:
    """GET /admin/stats: {(key, model): row} for the default grouping."""
    raw = await request(
        app, "GET", "/admin/stats", headers=bearer(key) if key else None, query=query
    )
    assert raw.status == 200, raw.body[:300]
    body = raw.json()
    return {(row["key"], row["model"]): row for row in body["data"]}


def stats_moved(before: dict, after: dict) -> dict:
    """{(key, model): {count: increase}} for the groups that moved."""
    names = ("requests", "prompt_tokens", "cached_tokens", "completion_tokens", "errors")
    out = {}
    for group, row in after.items():
        old = before.get(group, {})
        delta = {name: row[name] - old.get(name, 0) for name in names}
        if any(delta.values()):
            out[group] = delta
    return out


def sse_usage(body: bytes) -> dict:
    """The usage of an OpenAI chat stream (the chunk that carries it)."""
    usage = None
    for event in body.decode().split("\n\n"):
        data = event.removeprefix("data: ").strip()
        if data and data != "[DONE]":
            chunk = json.loads(data)
            usage = chunk.get("usage") or usage
    assert usage is not None, body[-500:]
    return usage
