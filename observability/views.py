"""GET /metrics (Prometheus text format, the `metrics` scope) and GET /admin/stats (usage
per key, model, hour or day; the `admin` scope)."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime

from django.db.models import Sum
from django.db.models.functions import TruncDay, TruncHour
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from rest_framework.response import Response
from rest_framework.views import APIView

from observability import metrics, recording, usage
from observability.models import UsageBucket
from pantheon_platform.errors import ApiError, invalid_request, method_not_allowed

GROUPS = ("key", "model", "hour", "day")
DEFAULT_GROUP_BY = ("key", "model")
# What each count is called in the answer (the usage object's names).
ANSWER_NAMES = {
    "requests": "requests",
    "prompt_tokens": "prompt_tokens",
    "cached_tokens": "cached_tokens",
    "generated_tokens": "completion_tokens",
    "errors": "errors",
}
# Sections an app adds to /admin/stats, each its name -> what it reports now (e.g. the
# stored responses, wire.responses): observability never imports an app.
SECTIONS: dict[str, Callable[[], dict]] = {}


def add_section(name: str, report: Callable[[], dict]) -> None:
    SECTIONS[name] = report


@csrf_exempt  # a POST is a 405, not a CSRF 403
async def metrics_view(request: HttpRequest) -> HttpResponse:
    """The exposition: a few hundred lines built in well under a millisecond, on the loop."""
    if request.method != "GET":
        return method_not_allowed(request.method or "", ["GET", "OPTIONS"]).response()
    if not recording.enabled():
        return ApiError(404, "metrics are off (PANTHEON_METRICS=0)", "not_found").response()
    body, content_type = metrics.exposition()
    return HttpResponse(body, content_type=content_type)


class StatsView(APIView):
    """GET /admin/stats?from=&to=&group_by=key,model: summed usage buckets whose start is
    in [from, to). The buffer is written first, so the answer includes every request
    answered before it. Then each of SECTIONS, as it stands now (not by range)."""

    def get(self, request):
        start = _instant(request.query_params.get("from"), "from")
        end = _instant(request.query_params.get("to"), "to")
        if start and end and end <= start:
            raise invalid_request("`to` must be after `from`", "to")
        group_by = _group_by(request.query_params.get("group_by"))
        usage.flush_quietly()  # a failed write is logged; what is stored is still answered
        rows = UsageBucket.objects.all()
        if start:
            rows = rows.filter(start__gte=start)
        if end:
            rows = rows.filter(start__lt=end)
        if "hour" in group_by:
            rows = rows.annotate(hour=TruncHour("start", tzinfo=UTC))
        if "day" in group_by:
            rows = rows.annotate(day=TruncDay("start", tzinfo=UTC))
        sums = {name: Sum(name) for name in UsageBucket.COUNTS}
        if group_by:
            grouped = rows.values(*group_by).annotate(**sums).order_by(*group_by)
        else:  # group_by= (empty): one row, the whole range
            grouped = [rows.aggregate(**sums)]
        return Response(
            {
                "object": "list",
                "from": _iso(start),
                "to": _iso(end),
                "group_by": list(group_by),
                "data": [_row(group, group_by) for group in grouped],
                **{name: report() for name, report in SECTIONS.items()},
            }
        )


def _row(group: dict, group_by: tuple[str, ...]) -> dict:
    row = {}
    for name in group_by:
        value = group[name]
        row[name] = _iso(value) if isinstance(value, datetime) else value
    for name, answer_name in ANSWER_NAMES.items():
        row[answer_name] = group[name] or 0
    return row


def _instant(value: str | None, param: str) -> datetime | None:
    """An ISO 8601 time (a zone-less one is UTC) or epoch seconds; None when absent."""
    if value is None or value == "":
        return None
    try:
        seconds = float(value)
    except ValueError:
        pass
    else:
        try:
            return datetime.fromtimestamp(seconds, UTC)
        except (OverflowError, OSError, ValueError):
            raise invalid_request(f"`{param}`: epoch seconds out of range", param) from None
    try:
        when = datetime.fromisoformat(value.replace("Z", "+00:00"))
        return when.astimezone(UTC) if when.tzinfo else when.replace(tzinfo=UTC)
    except (ValueError, OverflowError):  # not a time, or one beyond year 1..9999 in UTC
        raise invalid_request(
            f"`{param}` must be an ISO 8601 time (2025-01-31T12:00:00Z) or epoch seconds", param
        ) from None


def _group_by(value: str | None) -> tuple[str, ...]:
    """The grouping asked for; an empty one sums the whole range into one row."""
    if value is None:
        return DEFAULT_GROUP_BY
    names = tuple(name.strip() for name in value.split(",") if name.strip())
    unknown = [name for name in names if name not in GROUPS]
    if unknown or len(set(names)) != len(names):
        raise invalid_request(
            f"`group_by` takes distinct names among {', '.join(GROUPS)} (comma-separated)",
            "group_by",
        )
    return names


def _iso(when: datetime | None) -> str | None:
    if when is None:
        return None
    return when.astimezone(UTC).isoformat().replace("+00:00", "Z")
