"""What the access log hands over once per request (pantheon_site/access_log.py): the
request counters, the generation counters and histograms, the usage stats.

A generation request's turns (pantheon_platform.metering.TurnRecord) carry the usage its
response reported and the engine's timings; every other request only counts in
pantheon_requests_total (and pantheon_rejections_total when it was a 429).
"""

from __future__ import annotations

import logging
import time

from django.conf import settings

from observability import metrics, usage
from pantheon_platform.metering import TURNS_KEY, TurnRecord
from pantheon_platform.request_log import ERROR_KEY

log = logging.getLogger("pantheon.metrics")

# Route patterns (access_log.route_of) whose requests are generations: the usage stats
# count each of them, the refused ones (a 400, a 429) as errors.
GENERATION_ROUTES = frozenset(
    {
        "/v1/chat/completions",
        "/chat/completions",
        "/v1/completions",
        "/v1/messages",
        "/v1/responses",
        "/api/chat",
        "/api/generate",
    }
)


def enabled() -> bool:
    return settings.PANTHEON_METRICS


def request_ended(*, route: str, status: int | None, key: str, noted: dict, seconds: float) -> None:
    """Count one answered request. Never raises: the metrics are never why a request
    fails."""
    if not enabled():
        return
    try:
        _record(route, status, key, noted, seconds)
    except Exception:
        log.exception("metrics: a request could not be counted")


def _record(route: str, status: int | None, key: str, noted: dict, seconds: float) -> None:
    metrics.REQUESTS.labels(route, str(status) if status is not None else "none").inc()
    if status == 429:
        metrics.REJECTIONS.labels(noted.get(ERROR_KEY) or "unknown").inc()
    turns: list[TurnRecord] = noted.get(TURNS_KEY, [])
    arrived = time.perf_counter() - seconds
    counts = usage.Counts(requests=1, errors=int(status is None or status >= 400))
    for turn in turns:
        _record_turn(turn, arrived, counts)
    if any(turn.finishes or turn.streamed for turn in turns):  # refused ones did not run
        metrics.REQUEST_DURATION.labels(turns[0].model).observe(seconds)
    if turns or route in GENERATION_ROUTES:
        model = turns[0].model if turns else noted.get("model", "")
        usage.add(key, model, counts)


def _record_turn(turn: TurnRecord, arrived: float, counts: usage.Counts) -> None:
    model = turn.model
    prompt, cached, generated = turn.tokens()
    counts.prompt_tokens += prompt
    counts.cached_tokens += cached
    counts.generated_tokens += generated
    metrics.PROMPT_TOKENS.labels(model).inc(prompt)
    metrics.CACHED_PROMPT_TOKENS.labels(model).inc(cached)
    metrics.GENERATED_TOKENS.labels(model).inc(generated)
    finishes = turn.finishes.values()
    if not finishes:
        return
    tool_errors = sum(len(f.tool_call_errors) for f in finishes)
    if tool_errors:
        metrics.TOOL_CALL_ERRORS.labels(model).inc(tool_errors)
    not_enforced = sum(f.response_format_status == "not_enforced" for f in finishes)
    if not_enforced:
        metrics.GRAMMAR_NOT_ENFORCED.labels(model).inc(not_enforced)
    loops = sum(f.finish_reason == "repetition_loop" for f in finishes)
    if loops:
        metrics.REPETITION_LOOP_STOPS.labels(model).inc(loops)
    # The request waited once (its choices are admitted together); each choice decodes.
    metrics.QUEUE_WAIT.labels(model).observe(min(f.queue_wait_s for f in finishes))
    first_token_at = turn.first_token_at()
    if first_token_at is not None:
        metrics.TIME_TO_FIRST_TOKEN.labels(model).observe(max(0.0, first_token_at - arrived))
    for f in finishes:
        if f.usage.completion_tokens > 1:
            per_token = f.decode_s / (f.usage.completion_tokens - 1)
            metrics.TIME_PER_OUTPUT_TOKEN.labels(model).observe(per_token)
