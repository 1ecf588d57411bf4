"""pantheon_platform/fair_pool.py: one owner's flood never makes another owner wait."""

from __future__ import annotations

import threading
import time

from pantheon_platform.fair_pool import FairPool


def test_an_idle_owner_starts_at_once_while_another_floods():
    pool = FairPool(workers=2, per_owner=1, burst=2, thread_name_prefix="t")
    gate = threading.Event()
    flood = [pool.submit(lambda: gate.wait(10), owner="flooder") for _ in range(20)]
    time.sleep(0.05)
    assert pool.running("flooder") == 1  # its share: per_owner
    started = time.monotonic()
    assert pool.submit(lambda: "quick", owner="other").result(timeout=5) == "quick"
    assert time.monotonic() - started < 1.0
    gate.set()
    assert all(f.result(timeout=10) for f in flood)


def test_owners_take_turns_and_the_fewest_running_goes_first():
    pool = FairPool(workers=1, per_owner=1, burst=0, thread_name_prefix="t")
    gate = threading.Event()
    order: list[str] = []
    blocker = pool.submit(lambda: gate.wait(10), owner="a")
    jobs = [pool.submit(lambda o=o: order.append(o), owner=o) for o in "aaab"]
    gate.set()
    blocker.result(timeout=5)
    for job in jobs:
        job.result(timeout=5)
    assert order[:2] == ["a", "b"] or order[:2] == ["b", "a"]
    assert order.index("b") <= 1  # not behind a's three


def test_a_key_over_its_share_waits_with_no_burst_for_it():
    pool = FairPool(workers=4, per_owner=2, burst=4, thread_name_prefix="t")
    gate = threading.Event()
    jobs = [pool.submit(lambda: gate.wait(10), owner="k") for _ in range(6)]
    time.sleep(0.05)
    assert pool.running("k") == 2
    gate.set()
    for job in jobs:
        job.result(timeout=5)
    assert pool.running("k") == 0


def test_a_cancelled_job_never_runs_and_errors_reach_the_caller():
    pool = FairPool(workers=1, per_owner=1, burst=0, thread_name_prefix="t")
    gate = threading.Event()
    ran: list[int] = []
    blocker = pool.submit(lambda: gate.wait(10), owner="a")
    queued = pool.submit(lambda: ran.append(1), owner="a")
    assert queued.cancel()
    failing = pool.submit(lambda: 1 / 0, owner="b")
    gate.set()
    blocker.result(timeout=5)
    try:
        failing.result(timeout=5)
    except ZeroDivisionError:
        pass
    else:
        raise AssertionError("the error was lost")
    time.sleep(0.05)
    assert ran == []
