"""The console's index page: live charts per model, the models and their state, usage per
key.

The page (templates/observability/console_index.html, the admin site's index template:
pantheon_site/urls.py) is the Django admin's index with the dashboard above the app
list; its script (static/observability/dashboard.js) polls `dashboard_data` every 2 s
with the time of the last point it holds, and draws the series as SVG polylines. The
data route sits under /console/ behind the console's staff session (admin_view), like
every console page, not behind an API key.
"""

from __future__ import annotations

import math
import time
from datetime import UTC, datetime, timedelta

from django.db.models import Sum
from django.http import HttpRequest, JsonResponse

from observability import series
from observability.models import HOUR, UsageBucket
from observability.usage import hour_of
from pantheon_platform.errors import invalid_request, json_response, method_not_allowed
from pantheon_platform.runtime import LOADED, LOADING, UNLOADING, Runtime, get_runtime

INDEX_TEMPLATE = "observability/console_index.html"
USAGE_HOURS = 24  # the usage table covers the current hour and the 23 before it


def dashboard_data(request: HttpRequest) -> JsonResponse:
    """GET /console/dashboard.json?since=T: the points after wall time T (all of the
    window without it), the models and the usage per key."""
    if request.method != "GET":
        return method_not_allowed(request.method, ["GET"]).response()
    since = _since(request.GET.get("since", "0"))
    if since is None:
        return invalid_request(
            "`since` must be a time in seconds since the epoch", "since"
        ).response()
    sampler = series.running()
    points = sampler.snapshot(since) if sampler else _no_sampler()
    return json_response(
        {
            "now": time.time(),
            "window_s": points["window_s"],
            "interval_s": points["interval_s"],
            "sampling": sampler is not None,
            "models": model_rows(get_runtime(), points["models"]),
            "server": points["server"],
            "usage": usage_per_key(datetime.now(UTC)),
        }
    )


def _since(value: str) -> float | None:
    try:
        since = float(value)
    except ValueError:
        return None
    return since if math.isfinite(since) and since >= 0 else None


def _no_sampler() -> dict:
    """The shape of a snapshot where the sampler does not run (a management shell,
    the Django test client): no points."""
    return series.Sampler(registry=None).snapshot()


def model_rows(rt: Runtime, model_points: dict[str, dict]) -> list[dict]:
    """One row per model the runtime knows (loading, loaded, unloading, failed), with its
    new points; a model that is gone but still has points in the window is listed as
    "not loaded", so an unload does not wipe the last hour from the page."""
    states = rt.states()
    progress = {m.name: m.progress.as_dict() for m in rt.loading() if m.progress is not None}
    names = sorted(set(states) | set(model_points))
    rows = []
    for name in names:
        state = states.get(name)
        row = {
            "name": name,
            "state": state.state if state else "not loaded",
            "error": state.error if state else "",
            "series": model_points.get(name) or series.Series(series.MODEL_SERIES).since(0),
        }
        if row["state"] == LOADING and name in progress:
            row["progress"] = progress[name]
        info = rt.instance(name)
        if info is not None:
            row["state"] = UNLOADING if info.draining else LOADED
            row["in_flight"] = info.svc.in_flight
            row["memory_bytes"] = info.svc.memory_bytes
        rows.append(row)
    return rows


def usage_per_key(now: datetime) -> dict:
    """What each key asked of each model in the last USAGE_HOURS hours (the usage
    stats' hour rows, observability.usage: written every few seconds), most requests
    first."""
    first = hour_of(now) - timedelta(hours=USAGE_HOURS - 1)
    rows = (
        UsageBucket.objects.filter(span=HOUR, start__gte=first)
        .values("key", "model")
        .annotate(**{name: Sum(name) for name in UsageBucket.COUNTS})
        .order_by("-requests", "key", "model")
    )
    return {
        "period": f"Since {first:%Y-%m-%d %H:%M} UTC (the last {USAGE_HOURS} hours)",
        "rows": [
            {**row, "key": row["key"] or "(no key)", "model": row["model"] or "(no model)"}
            for row in rows
        ],
    }
