"""The Prometheus metrics: every counter and histogram Pantheon keeps, and the exposition.

Names and labels are documented in README.md (Metrics). Label values are bounded and
never a client's text: `route` is the URL pattern a path matched (access_log.route_of),
`model` the served model's name (the operator's), `reason` an error type of ours.

The gauges are not here: they are read from the runtime when scraped (collectors.py), so
they are never stale.

One process (Daphne's default): the metrics live in a registry of their own. Several
processes: set PROMETHEUS_MULTIPROC_DIR to an empty folder writable by every worker
before they start; each process writes its counters and histograms there
(prometheus_client.multiprocess) and a scrape of any of them sums every process's. The
gauges then describe the process that answered the scrape.
"""

from __future__ import annotations

import os

import prometheus_client
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.exposition import CONTENT_TYPE_LATEST, generate_latest

from observability.collectors import RuntimeCollector

# Only the documented series: no `_created` sample beside each counter and histogram.
prometheus_client.disable_created_metrics()

MULTIPROCESS = bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))
# Single process: our own registry (not prometheus_client's global one, which other
# libraries in the process may use). Multiprocess: values go to the shared folder.
REGISTRY = None if MULTIPROCESS else CollectorRegistry()

# Buckets in seconds, from a fast CPU decode step to a long queue.
TTFT_BUCKETS = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
TPOT_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5)
DURATION_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)
QUEUE_BUCKETS = (0.001, 0.005, 0.01, 0.05, 0.1, 0.5, 1, 2.5, 5, 10, 30, 60)


def _counter(name: str, doc: str, labels: tuple[str, ...]) -> Counter:
    # prometheus_client adds `_total` to a counter's name in the exposition.
    return Counter(name.removesuffix("_total"), doc, labels, registry=REGISTRY)


def _histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Histogram:
    return Histogram(name, doc, ("model",), buckets=buckets, registry=REGISTRY)


REQUESTS = _counter(
    "pantheon_requests_total",
    "HTTP requests answered, by route pattern and status.",
    ("route", "status"),
)
PROMPT_TOKENS = _counter(
    "pantheon_prompt_tokens_total",
    "Prompt tokens of generation requests (usage.prompt_tokens).",
    ("model",),
)
CACHED_PROMPT_TOKENS = _counter(
    "pantheon_cached_prompt_tokens_total",
    "Prompt tokens served from a session's cached KV (usage.cached_tokens).",
    ("model",),
)
GENERATED_TOKENS = _counter(
    "pantheon_generated_tokens_total",
    "Tokens generated, every choice (usage.completion_tokens).",
    ("model",),
)
REJECTIONS = _counter(
    "pantheon_rejections_total", "Requests answered 429, by the error type.", ("reason",)
)
TOOL_CALL_ERRORS = _counter(
    "pantheon_tool_call_errors_total",
    "Tool calls a model started and did not finish well-formed.",
    ("model",),
)
GRAMMAR_NOT_ENFORCED = _counter(
    "pantheon_grammar_not_enforced_total",
    "Choices whose response_format check could not finish (response_format_status not_enforced).",
    ("model",),
)
REPETITION_LOOP_STOPS = _counter(
    "pantheon_repetition_loop_stops_total",
    "Choices ended by the loop detector (finish_reason repetition_loop).",
    ("model",),
)

TIME_TO_FIRST_TOKEN = _histogram(
    "pantheon_time_to_first_token_seconds",
    "From the request's arrival to its first generated token.",
    TTFT_BUCKETS,
)
TIME_PER_OUTPUT_TOKEN = _histogram(
    "pantheon_time_per_output_token_seconds",
    "Mean seconds between a choice's generated tokens after the first.",
    TPOT_BUCKETS,
)
REQUEST_DURATION = _histogram(
    "pantheon_request_duration_seconds",
    "Generation requests end to end, from arrival to the response's last byte.",
    DURATION_BUCKETS,
)
BATCH_LINES = _counter(
    "pantheon_batch_lines_total",
    "Batch lines (wire/batches) by state: started (sent to their endpoint), completed "
    "(answered 2xx, in the output file), failed (an error line); redone lines count again.",
    ("state",),
)
QUEUE_WAIT = _histogram(
    "pantheon_queue_wait_seconds",
    "Seconds a generation waited in the model's queue before its slots were given.",
    QUEUE_BUCKETS,
)


def scrape_registry() -> CollectorRegistry:
    """What a scrape reads: the registry (one process), or every process's metrics from
    PROMETHEUS_MULTIPROC_DIR and this process's gauges."""
    if not MULTIPROCESS:
        return REGISTRY
    from prometheus_client import multiprocess

    registry = CollectorRegistry()
    multiprocess.MultiProcessCollector(registry)
    registry.register(RuntimeCollector())
    return registry


def exposition() -> tuple[bytes, str]:
    """(the text exposition of every metric and gauge, its content type)."""
    return generate_latest(scrape_registry()), CONTENT_TYPE_LATEST


if not MULTIPROCESS:
    REGISTRY.register(RuntimeCollector())
