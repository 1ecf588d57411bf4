"""The console dashboard's time series: one hour of points per model, sampled from the
Prometheus metrics (observability.metrics) every few seconds.

A `Sampler` reads a registry (`collect()`), turns counters into rates (generated
tokens/s from the deltas between two reads), histograms into percentiles (TTFT p50/p95
from the bucket deltas over the last minute, as Prometheus' histogram_quantile does) and
keeps the gauges (queue, running requests, KV tokens, parked sessions) as read. Points
older than the window are dropped, so memory is bounded whatever the uptime. One sampler
thread runs in the server (`start`, called by pantheon_site.asgi); tests drive
`Sampler.sample(now)` by hand on a registry of their own.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

WINDOW_S = 3600.0  # the dashboard shows the last hour
INTERVAL_S = 2.0  # one read of the registry every INTERVAL_S
# TTFT percentiles are over the first tokens of the last minute: a 2 s interval holds one
# or two of them at most, too few for a p95.
PERCENTILE_WINDOW_S = 60.0

GENERATED = "pantheon_generated_tokens_total"
TTFT_BUCKET = "pantheon_time_to_first_token_seconds_bucket"
# Gauges read per model: the series' name -> the metric's sample name.
MODEL_GAUGES = {
    "waiting": "pantheon_requests_waiting",
    "running": "pantheon_requests_running",
    "kv_used": "pantheon_kv_tokens_used",
    "kv_capacity": "pantheon_kv_tokens_capacity",
}
SERVER_GAUGES = {
    "sessions_parked": "pantheon_sessions_parked",
    "sessions_parked_bytes": "pantheon_sessions_parked_bytes",
}
MODEL_SERIES = ("tokens_per_s", "ttft_p50", "ttft_p95", *MODEL_GAUGES)
SERVER_SERIES = tuple(SERVER_GAUGES)

Buckets = tuple[tuple[float, float], ...]  # (upper bound, cumulative count), by bound


@dataclass
class Reading:
    """What one read of the registry holds that the series need."""

    mono: float  # time.monotonic(): rates are computed on it (the wall clock may step)
    generated: dict[str, float] = field(default_factory=dict)  # model -> counter value
    ttft: dict[str, Buckets] = field(default_factory=dict)  # model -> cumulative buckets
    model_gauges: dict[str, dict[str, float]] = field(default_factory=dict)  # model -> values
    server_gauges: dict[str, float] = field(default_factory=dict)


def read_registry(registry, mono: float) -> Reading:
    """One pass over `registry.collect()`, keeping the dashboard's samples."""
    reading = Reading(mono)
    gauge_series = {metric: series for series, metric in MODEL_GAUGES.items()}
    server_series = {metric: series for series, metric in SERVER_GAUGES.items()}
    ttft: dict[str, list[tuple[float, float]]] = {}
    for family in registry.collect():
        for sample in family.samples:
            name, labels, value = sample.name, sample.labels, float(sample.value)
            model = labels.get("model", "")
            if name == GENERATED:
                reading.generated[model] = value
            elif name == TTFT_BUCKET:
                ttft.setdefault(model, []).append((float(labels["le"]), value))
            elif name in gauge_series:
                reading.model_gauges.setdefault(model, {})[gauge_series[name]] = value
            elif name in server_series:
                reading.server_gauges[server_series[name]] = value
    reading.ttft = {model: tuple(sorted(buckets)) for model, buckets in ttft.items()}
    return reading


def bucket_quantile(q: float, buckets: Buckets) -> float | None:
    """The q-quantile of the observations counted in cumulative `buckets`, interpolated
    linearly inside the bucket it falls in (Prometheus' histogram_quantile): None with no
    observations; the highest finite bound when it falls in the +Inf bucket."""
    if not buckets or buckets[-1][1] <= 0:
        return None
    rank = q * buckets[-1][1]
    lower, below = 0.0, 0.0
    for bound, count in buckets:
        if count >= rank:
            if math.isinf(bound):
                return lower
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    return lower


def bucket_delta(now: Buckets, before: Buckets | None) -> Buckets:
    """What was observed between two reads of one histogram (a reset counts from zero)."""
    if not before or before[-1][1] > now[-1][1]:
        return now
    counts = dict(before)
    return tuple((bound, count - counts.get(bound, 0.0)) for bound, count in now)


def counter_rate(now: float, before: float | None, seconds: float) -> float:
    """Per-second increase of a counter; a counter that went down was reset (a process
    restart under multiprocess mode) and counts from zero, as Prometheus' rate() does."""
    if seconds <= 0:
        return 0.0
    increase = now if before is None or now < before else now - before
    return increase / seconds


class Series:
    """Columns of points for one chart group: a time column and one column per name,
    trimmed to the window by time."""

    def __init__(self, names: Iterable[str]) -> None:
        self.names = tuple(names)
        self.t: deque[float] = deque()
        self.columns: dict[str, deque] = {name: deque() for name in self.names}

    def append(self, t: float, values: dict[str, float | None]) -> None:
        self.t.append(t)
        for name in self.names:
            self.columns[name].append(values.get(name))

    def trim(self, oldest: float) -> None:
        while self.t and self.t[0] < oldest:
            self.t.popleft()
            for column in self.columns.values():
                column.popleft()

    def since(self, t: float) -> dict[str, list]:
        """The points after wall time `t`, as JSON-ready columns."""
        start = next((i for i, ti in enumerate(self.t) if ti > t), len(self.t))
        out = {"t": [round(ti, 3) for ti in list(self.t)[start:]]}
        for name, column in self.columns.items():
            out[name] = [_rounded(v) for v in list(column)[start:]]
        return out

    def __len__(self) -> int:
        return len(self.t)


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


class Sampler:
    """Reads `registry` on each `sample()` and keeps the last `window_s` of points."""

    def __init__(
        self,
        registry,
        *,
        window_s: float = WINDOW_S,
        percentile_window_s: float = PERCENTILE_WINDOW_S,
    ) -> None:
        self.registry = registry
        self.window_s = window_s
        self.percentile_window_s = percentile_window_s
        self.models: dict[str, Series] = {}
        self.server = Series(SERVER_SERIES)
        self._previous: Reading | None = None
        # Reads of the last percentile window (their TTFT buckets), oldest first.
        self._recent: deque[Reading] = deque()
        self._lock = threading.Lock()

    def sample(self, now: float | None = None, mono: float | None = None) -> None:
        """Read the registry once and append a point per model (from the second read on:
        a rate needs two). `now` is the wall time the points carry."""
        now = time.time() if now is None else now
        reading = read_registry(self.registry, time.monotonic() if mono is None else mono)
        with self._lock:
            self._append(now, reading)

    def _append(self, now: float, reading: Reading) -> None:
        previous, self._previous = self._previous, reading
        self._recent.append(reading)
        while reading.mono - self._recent[0].mono > self.percentile_window_s:
            self._recent.popleft()
        if previous is None:
            return
        seconds = reading.mono - previous.mono
        oldest = self._recent[0]
        models = set(reading.generated) | set(reading.ttft) | set(reading.model_gauges)
        for model in sorted(models):
            values: dict[str, float | None] = dict(reading.model_gauges.get(model, {}))
            if model in reading.generated:
                values["tokens_per_s"] = counter_rate(
                    reading.generated[model], previous.generated.get(model), seconds
                )
            if model in reading.ttft:
                recent = bucket_delta(reading.ttft[model], oldest.ttft.get(model))
                values["ttft_p50"] = bucket_quantile(0.5, recent)
                values["ttft_p95"] = bucket_quantile(0.95, recent)
            self.models.setdefault(model, Series(MODEL_SERIES)).append(now, values)
        self.server.append(now, reading.server_gauges)
        self._trim(now - self.window_s)

    def _trim(self, oldest: float) -> None:
        self.server.trim(oldest)
        for model in list(self.models):
            self.models[model].trim(oldest)
            if not self.models[model]:
                del self.models[model]  # nothing of it left in the window

    def snapshot(self, since: float = 0.0) -> dict:
        """The points after wall time `since`: {"models": {name: columns}, "server":
        columns}; a client that keeps what it had asks only for what is new."""
        with self._lock:
            return {
                "window_s": self.window_s,
                "interval_s": INTERVAL_S,
                "models": {name: s.since(since) for name, s in sorted(self.models.items())},
                "server": self.server.since(since),
            }


# --- the server's sampler -------------------------------------------------------------

_sampler: Sampler | None = None
_start_lock = threading.Lock()


def start(registry, interval_s: float = INTERVAL_S) -> Sampler:
    """Start the server's sampler thread on `registry` (observability.metrics.
    scrape_registry(): what a scrape reads, every process's under multiprocess mode);
    once, later calls return it."""
    global _sampler
    with _start_lock:
        if _sampler is None:
            _sampler = Sampler(registry)
            threading.Thread(
                target=_run, args=(_sampler, interval_s), name="pantheon-series", daemon=True
            ).start()
        return _sampler


def running() -> Sampler | None:
    """The server's sampler, or None where none was started (tests, management commands)."""
    return _sampler


def _run(sampler: Sampler, interval_s: float) -> None:
    while True:
        try:
            sampler.sample()
        except Exception:  # a collector's failure must not end the series for good
            log.exception("dashboard sampler: reading the metrics failed")
        time.sleep(interval_s)
