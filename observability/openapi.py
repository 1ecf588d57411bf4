"""The OpenAPI pieces of GET /metrics and GET /admin/stats (observability/urls.py);
pantheon_site/openapi.py puts the document together."""

from __future__ import annotations

from observability.views import GROUPS
from pantheon_platform.openapi import NON_NEGATIVE, STRING, nullable, obj, ok, operation, query, ref

_INSTANT = {
    "type": "string",
    "description": "ISO 8601 (2025-01-31T12:00:00Z; without a zone: UTC) or epoch seconds.",
}
_USAGE_ROW = obj(
    {
        "key": {
            "type": "string",
            "description": "The API key's label (env:client, env:admin, console:<prefix>); "
            '"" for requests that needed no key.',
        },
        "model": {"type": "string", "description": 'The served model; "" when none was.'},
        "hour": {"type": "string", "description": "The hour's start (UTC)."},
        "day": {"type": "string", "description": "The day's start (UTC)."},
        "requests": NON_NEGATIVE,
        "prompt_tokens": NON_NEGATIVE,
        "cached_tokens": NON_NEGATIVE,
        "completion_tokens": NON_NEGATIVE,
        "errors": {**NON_NEGATIVE, "description": "Requests answered with a status >= 400."},
    },
    ("requests", "prompt_tokens", "cached_tokens", "completion_tokens", "errors"),
)

# What the Responses API stores now (wire/responses/storage.py adds it to the answer).
_STORED_RESPONSES = obj(
    {
        "count": NON_NEGATIVE,
        "bytes": NON_NEGATIVE,
        "by_key": {
            "type": "array",
            "items": obj(
                {
                    "namespace": {
                        "type": "string",
                        "description": 'Whose: "key:<console key id>", "env:client", '
                        '"env:admin" or "open".',
                    },
                    "count": NON_NEGATIVE,
                    "bytes": NON_NEGATIVE,
                },
                ("namespace", "count", "bytes"),
            ),
        },
        "limits": obj(
            {
                "max_item_bytes": NON_NEGATIVE,
                "max_bytes_per_key": NON_NEGATIVE,
                "max_per_key": NON_NEGATIVE,
                "ttl_s": NON_NEGATIVE,
            }
        ),
    },
    ("count", "bytes", "by_key", "limits"),
    description="Stored responses now (not by range), with the PANTHEON_RESPONSES_* limits.",
)


def schemas() -> dict:
    return {
        "UsageStats": obj(
            {
                "object": {"const": "list"},
                "from": nullable(STRING),
                "to": nullable(STRING),
                "group_by": {"type": "array", "items": {"enum": list(GROUPS)}},
                "data": {"type": "array", "items": _USAGE_ROW},
                "stored_responses": _STORED_RESPONSES,
            },
            ("object", "from", "to", "group_by", "data"),
        )
    }


def add_paths(paths: dict[str, dict]) -> None:
    metrics = operation(
        "/metrics",
        "metrics",
        "Prometheus metrics (text exposition format 0.0.4)",
        {
            "description": "Every counter, histogram and gauge (README.md, Metrics).",
            "content": {"text/plain": {"schema": STRING}},
        },
        (404,),
        tag="operator",
    )
    stats = operation(
        "/admin/stats",
        "usageStats",
        "Usage per key, model, hour or day, summed over a time range",
        ok(ref("UsageStats")),
        (400,),
        parameters=[
            query("from", _INSTANT, description="Buckets starting at or after this."),
            query("to", _INSTANT, description="Buckets starting before this."),
            query(
                "group_by",
                {"type": "string"},
                description=f"Comma-separated, among {', '.join(GROUPS)} (default key,model; "
                "empty: one row for the whole range).",
            ),
        ],
        tag="operator",
    )
    paths.update({"/metrics": {"get": metrics}, "/admin/stats": {"get": stats}})
