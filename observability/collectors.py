"""The gauges, and the engine's own counters: read from the runtime at each scrape (never a
stale value kept between)."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from pantheon_platform.runtime import get_runtime

# (name, help, what a ModelService reports): one series per served model.
PER_MODEL = (
    (
        "pantheon_requests_running",
        "Requests admitted to a model's slots and not finished.",
        lambda svc: svc.in_flight - svc.queued,
    ),
    (
        "pantheon_requests_waiting",
        "Requests in a model's queue, waiting for slots.",
        lambda svc: svc.queued,
    ),
    (
        "pantheon_slots_busy",
        "KV slots holding a sequence.",
        lambda svc: svc.slots_busy,
    ),
    (
        "pantheon_slots_total",
        "KV slots served now (max_concurrent: the memory ladder may lower it).",
        lambda svc: svc.max_concurrent,
    ),
    (
        "pantheon_kv_tokens_used",
        "KV positions the running sequences fill.",
        lambda svc: svc.kv_tokens_used,
    ),
    (
        "pantheon_kv_tokens_capacity",
        "KV positions served now: slots x context window.",
        lambda svc: svc.max_concurrent * svc.context_window,
    ),
    (
        "pantheon_prefix_cache_slots_kept",
        "Free KV slots keeping their last request's KV for a prompt that continues it.",
        lambda svc: len(svc.slot_contents),
    ),
    (
        "pantheon_prefix_cache_host_bytes",
        "Bytes of kept prefixes copied to host memory when a new prompt took their slot.",
        lambda svc: svc.slot_contents.spilled_bytes(),
    ),
    (
        "pantheon_weight_bytes",
        "Bytes of a model's weights in memory.",
        lambda svc: svc.model.weight_bytes,
    ),
)

# (name without _total, help, what a ModelService has counted since it loaded): counters
# the engine keeps itself, one series per served model. A reload starts them from 0 again,
# which Prometheus reads as a counter reset.
PER_MODEL_COUNTERS = (
    (
        "pantheon_speculative_draft_tokens",
        "Tokens drafted for speculative decoding (from the context and from requests' "
        "prediction) and checked in a verify pass.",
        lambda svc: svc.stats.drafted_tokens,
    ),
    (
        "pantheon_speculative_accepted_tokens",
        "Drafted tokens the verify pass confirmed: emitted without a decode step of their own.",
        lambda svc: svc.stats.accepted_draft_tokens,
    ),
    (
        "pantheon_speculative_draft_model_tokens",
        "Of the drafted tokens, those the model's draft model (the draft_model load "
        "option) proposed.",
        lambda svc: svc.stats.model_drafted_tokens,
    ),
    (
        "pantheon_speculative_draft_model_accepted_tokens",
        "Of the accepted tokens, those the model's draft model proposed.",
        lambda svc: svc.stats.model_accepted_tokens,
    ),
)


class RuntimeCollector:
    """A prometheus_client collector over get_runtime(): the per-model gauges and engine
    counters of every served name, and the process-wide gauges."""

    def collect(self):
        services = get_runtime().services()
        for name, doc, read in PER_MODEL:
            family = GaugeMetricFamily(name, doc, labels=("model",))
            for model, svc in sorted(services.items()):
                family.add_metric((model,), read(svc))
            yield family
        for name, doc, read in PER_MODEL_COUNTERS:
            counter = CounterMetricFamily(name, doc, labels=("model",))
            for model, svc in sorted(services.items()):
                counter.add_metric((model,), read(svc))
            yield counter
        # A service registered under two names is counted once.
        distinct = list({id(svc): svc for svc in services.values()}.values())
        yield GaugeMetricFamily(
            "pantheon_sessions_parked",
            "Session ids holding parked KV, every model.",
            value=sum(len(svc.sessions) for svc in distinct),
        )
        yield GaugeMetricFamily(
            "pantheon_sessions_parked_bytes",
            "Bytes of the parked sessions' KV, every model.",
            value=sum(
                conv.nbytes for svc in distinct for _, conv, *_ in svc.sessions.conversations()
            ),
        )
        yield GaugeMetricFamily(
            "pantheon_memory_ladder_rung",
            "The memory-pressure ladder's rung, highest over the models: 0 normal, 1 "
            "elevated, 2 high, 3 critical.",
            value=max((svc.ladder.level for svc in distinct), default=0),
        )
        yield GaugeMetricFamily(
            "pantheon_models_loaded", "Models served now (names).", value=len(services)
        )
