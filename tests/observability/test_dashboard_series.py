"""The dashboard's sampler (observability/series.py) on a real prometheus_client registry:
rates from counter deltas, TTFT percentiles from histogram bucket deltas, gauges as read,
one window of points kept. Times are passed in, so nothing sleeps."""

from __future__ import annotations

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from observability.series import Sampler, bucket_quantile

BUCKETS = (0.1, 0.25, 0.5, 1.0)


class Metrics:
    """The metrics the sampler reads, under their exposed names, in a registry of their own."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.generated = Counter("pantheon_generated_tokens", "", ["model"], registry=r)
        self.ttft = Histogram(
            "pantheon_time_to_first_token_seconds", "", ["model"], buckets=BUCKETS, registry=r
        )
        self.waiting = Gauge("pantheon_requests_waiting", "", ["model"], registry=r)
        self.running = Gauge("pantheon_requests_running", "", ["model"], registry=r)
        self.kv_used = Gauge("pantheon_kv_tokens_used", "", ["model"], registry=r)
        self.kv_capacity = Gauge("pantheon_kv_tokens_capacity", "", ["model"], registry=r)
        self.sessions = Gauge("pantheon_sessions_parked", "", registry=r)


@pytest.fixture
def metrics() -> Metrics:
    return Metrics()


def sample(sampler: Sampler, t: float) -> None:
    sampler.sample(now=1_000_000 + t, mono=t)


def test_generated_tokens_per_second_is_the_counter_delta_over_the_interval(metrics):
    sampler = Sampler(metrics.registry)
    metrics.generated.labels("a").inc(10)  # before the first read: not part of any rate
    sample(sampler, 0)
    metrics.generated.labels("a").inc(40)
    metrics.generated.labels("b").inc(5)  # first seen in this interval: all of it is new
    sample(sampler, 2)
    metrics.generated.labels("a").inc(3)
    sample(sampler, 5)

    series = sampler.snapshot()["models"]
    assert series["a"]["tokens_per_s"] == [20.0, 1.0]
    assert series["a"]["t"] == [1_000_002, 1_000_005]
    assert series["b"]["tokens_per_s"] == [2.5, 0.0]


def test_the_first_read_only_sets_the_baseline(metrics):
    sampler = Sampler(metrics.registry)
    metrics.generated.labels("a").inc(100)
    sample(sampler, 0)
    assert sampler.snapshot()["models"] == {}


def test_a_counter_that_went_down_was_reset_and_counts_from_zero(metrics):
    sampler = Sampler(metrics.registry)
    metrics.generated.labels("a").inc(100)
    sample(sampler, 0)
    restarted = Metrics()  # e.g. a worker process restarted under multiprocess mode
    restarted.generated.labels("a").inc(8)
    sampler.registry = restarted.registry
    sample(sampler, 2)
    assert sampler.snapshot()["models"]["a"]["tokens_per_s"] == [4.0]


def test_ttft_percentiles_interpolate_in_the_bucket_like_histogram_quantile(metrics):
    sampler = Sampler(metrics.registry)
    sample(sampler, 0)
    for seconds in [0.05] * 5 + [0.3] * 4 + [2.0]:
        metrics.ttft.labels("a").observe(seconds)
    sample(sampler, 2)
    a = sampler.snapshot()["models"]["a"]
    # Cumulative: 0.1 -> 5, 0.25 -> 5, 0.5 -> 9, 1 -> 9, +Inf -> 10. The median (rank 5)
    # is the top of the first bucket; p95 (rank 9.5) lies in +Inf: the highest bound.
    assert a["ttft_p50"] == [0.1]
    assert a["ttft_p95"] == [1.0]


def test_ttft_percentiles_cover_only_the_recent_window(metrics):
    sampler = Sampler(metrics.registry, percentile_window_s=10)
    sample(sampler, 0)
    metrics.ttft.labels("a").observe(0.9)  # slow, early
    sample(sampler, 2)
    for t in range(4, 14, 2):
        sample(sampler, t)  # nothing new
    metrics.ttft.labels("a").observe(0.2)  # fast, 12 s after the slow one
    sample(sampler, 14)
    sample(sampler, 26)  # nothing in the last 10 s

    a = sampler.snapshot()["models"]["a"]
    # At 2 s and 4 s the slow one is inside the window; at 14 s only the fast one is
    # (0.2 lies in (0.1, 0.25]: interpolated to its middle rank); at 26 s nothing is.
    assert a["ttft_p50"][0] == pytest.approx(0.75)
    assert a["ttft_p50"][-2] == pytest.approx(0.175)
    assert a["ttft_p50"][-1] is None


def test_gauges_are_kept_as_read(metrics):
    sampler = Sampler(metrics.registry)
    sample(sampler, 0)
    metrics.waiting.labels("a").set(3)
    metrics.running.labels("a").set(2)
    metrics.kv_used.labels("a").set(1500)
    metrics.kv_capacity.labels("a").set(8192)
    metrics.sessions.set(4)
    sample(sampler, 2)
    snap = sampler.snapshot()
    a = snap["models"]["a"]
    assert (a["waiting"], a["running"], a["kv_used"], a["kv_capacity"]) == (
        [3.0],
        [2.0],
        [1500.0],
        [8192.0],
    )
    assert snap["server"]["sessions_parked"] == [4.0]


def test_points_older_than_the_window_are_dropped(metrics):
    sampler = Sampler(metrics.registry, window_s=10)
    metrics.waiting.labels("a").set(1)
    for t in range(0, 30, 2):
        sample(sampler, t)
    times = sampler.snapshot()["models"]["a"]["t"]
    assert times[0] >= 1_000_000 + 28 - 10 and times[-1] == 1_000_028
    assert len(sampler.server) == len(times)


def test_a_model_with_no_point_left_in_the_window_is_forgotten(metrics):
    sampler = Sampler(metrics.registry, window_s=10)
    metrics.waiting.labels("gone").set(1)
    sample(sampler, 0)
    sample(sampler, 2)
    metrics.waiting.remove("gone")  # unloaded: its gauges are no longer collected
    for t in range(4, 20, 2):
        sample(sampler, t)
    assert "gone" not in sampler.snapshot()["models"]


def test_a_snapshot_since_a_time_holds_only_the_newer_points(metrics):
    sampler = Sampler(metrics.registry)
    for t in range(0, 10, 2):
        metrics.generated.labels("a").inc(2)
        sample(sampler, t)
    newer = sampler.snapshot(since=1_000_004)["models"]["a"]
    assert newer["t"] == [1_000_006, 1_000_008]
    assert newer["tokens_per_s"] == [1.0, 1.0]


@pytest.mark.parametrize(
    ("q", "buckets", "expected"),
    [
        (0.5, ((0.1, 0), (1.0, 0), (float("inf"), 0)), None),  # nothing observed
        (0.5, ((0.1, 0), (1.0, 4), (float("inf"), 4)), 0.55),  # middle of (0.1, 1]
        (0.25, ((0.1, 4), (1.0, 4), (float("inf"), 4)), 0.025),  # first bucket starts at 0
        (0.99, ((0.1, 1), (1.0, 1), (float("inf"), 2)), 1.0),  # in +Inf: the highest bound
    ],
)
def test_bucket_quantile(q, buckets, expected):
    assert bucket_quantile(q, buckets) == (None if expected is None else pytest.approx(expected))
