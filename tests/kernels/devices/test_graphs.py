"""The CUDA-graph slot bookkeeping (kernels/devices/graphs.py) with capture functions of the
test's own: which bucket a step runs in, capture on the second use, replay after, a failed
capture falling back to the direct step and retried on a doubling backoff until it gives
up, and the contract's `graphs` objects. The CuPy capture itself is tests/gpu's."""

from __future__ import annotations

import pytest

from kernels.devices.graphs import MAX_CAPTURE_FAILURES, GraphSlots, bucket_for


def DIRECT(*inputs):
    return "direct"


def REPLAY(*inputs):
    return "replayed"


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_a_step_runs_in_the_smallest_bucket_that_holds_it():
    assert [bucket_for(b) for b in (1, 2, 3, 5, 8, 9, 33, 64)] == [1, 2, 4, 8, 8, 16, 64, 64]
    assert bucket_for(65) is None


def test_captured_on_the_second_use_then_replayed():
    slots, calls = GraphSlots(clock=Clock()), []

    def capture(bucket):
        calls.append(("capture", bucket))
        return REPLAY

    assert slots.run("die0", 3, DIRECT, capture) == "direct"  # warm-up: direct
    assert slots.report() == {"live": 0, "total": 1, "failed": 0, "ineligible": 0, "pending": 1}
    assert slots.run("die0", 4, DIRECT, capture) == "replayed"
    assert slots.run("die0", 3, DIRECT, capture) == "replayed"
    assert calls == [("capture", 4)]
    assert slots.report() == {"live": 1, "total": 1, "failed": 0, "ineligible": 0, "pending": 0}


def test_only_exercised_slots_count_and_wide_steps_are_ineligible():
    slots = GraphSlots(clock=Clock())
    assert slots.report() is None  # nothing exercised: the object is omitted
    for rows in (1, 1, 100, 100):
        slots.run("die0", rows, DIRECT, lambda b: REPLAY)
    assert slots.report() == {"live": 1, "total": 2, "failed": 0, "ineligible": 1, "pending": 0}


def test_a_failed_capture_runs_direct_and_is_retried_on_a_backoff_until_it_gives_up():
    clock, attempts = Clock(), []
    slots = GraphSlots(clock=clock)

    def failing(bucket):
        attempts.append(clock.now)
        raise RuntimeError("cudaErrorStreamCaptureUnsupported")

    slots.run("die0", 2, DIRECT, failing)  # warm-up
    for _ in range(3):  # one attempt, then the backoff holds the next ones
        assert slots.run("die0", 2, DIRECT, failing) == "direct"
    assert attempts == [0.0]
    report = slots.report(operator=True)
    assert report["failed"] == 1 and report["gave_up"] == 0
    assert report["capture_failures"] == 1 and report["captures"] == 0
    for _ in range(MAX_CAPTURE_FAILURES + 3):
        clock.now += 100.0
        assert slots.run("die0", 2, DIRECT, failing) == "direct"
    assert len(attempts) == MAX_CAPTURE_FAILURES  # then it stopped trying
    report = slots.report(operator=True)
    assert report["gave_up"] == 1 and report["failed"] == 1
    assert report["segment"] == {
        "live": 0,
        "total": 1,
        "failed": 1,
        "ineligible": 0,
        "pending": 0,
    }


def test_a_transient_failure_heals_on_the_retry():
    clock, outcomes = Clock(), iter([RuntimeError("busy"), None])
    slots = GraphSlots(clock=clock)

    def flaky(bucket):
        error = next(outcomes)
        if error:
            raise error
        return REPLAY

    slots.run("k", 1, DIRECT, flaky)
    assert slots.run("k", 1, DIRECT, flaky) == "direct"
    clock.now += 1.0  # the first backoff
    assert slots.run("k", 1, DIRECT, flaky) == "replayed"
    report = slots.report(operator=True)
    assert (report["live"], report["failed"], report["captures"]) == (1, 0, 1)
    assert report["capture_failures"] == 1


@pytest.mark.parametrize("keys", [["die0", "die1"]])
def test_each_stage_has_its_own_slots(keys):
    slots = GraphSlots(clock=Clock())
    for key in keys:
        for _ in range(2):
            slots.run(key, 8, DIRECT, lambda b: REPLAY)
    assert slots.report()["live"] == 2


def test_the_inputs_reach_the_direct_step_and_the_replay():
    slots, seen = GraphSlots(clock=Clock()), []

    def capture(bucket):
        return lambda *inputs: seen.append(("replay", bucket, inputs))

    for tokens in ([1], [2, 3], [4]):
        slots.run("die0", len(tokens), lambda *i: seen.append(("direct", i)), capture, tokens)
    assert seen == [("direct", ([1],)), ("direct", ([2, 3],)), ("replay", 1, ([4],))]
