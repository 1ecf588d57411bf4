"""engine/serving/jobs.py: side jobs take turns by owner, and within an owner, one step
each, so a small embedding is not stuck behind a huge one."""

from __future__ import annotations

import threading

from engine.serving.jobs import WORK_OWNER, JobQueue


def steps(name: str, n: int, log: list[str]):
    for _ in range(n):
        log.append(name)
        yield
    return name


def drain(queue: JobQueue) -> None:
    while queue.advance():
        pass


def test_a_small_job_finishes_within_a_few_steps_of_a_huge_one():
    log: list[str] = []
    queue = JobQueue("t", threading.Lock())
    huge = queue.submit(steps("huge", 1000, log), owner="a")
    small = queue.submit(steps("small", 1, log), owner="b")
    for _ in range(4):
        queue.advance()
    assert small.done() and small.result() == "small"
    assert not huge.done()
    drain(queue)
    assert huge.result() == "huge" and log.count("huge") == 1000


def test_owners_take_turns_whatever_their_number_of_jobs():
    log: list[str] = []
    queue = JobQueue("t", threading.Lock())
    for i in range(5):
        queue.submit(steps(f"a{i}", 3, log), owner="a")
    queue.submit(steps("b", 3, log), owner="b")
    drain(queue)
    owners = [name[0] for name in log]
    assert owners[:6] == ["a", "b", "a", "b", "a", "b"]


def test_one_owners_jobs_also_take_turns():
    log: list[str] = []
    queue = JobQueue("t", threading.Lock())
    queue.submit(steps("x", 3, log), owner="a")
    queue.submit(steps("y", 3, log), owner="a")
    drain(queue)
    assert log == ["x", "y", "x", "y", "x", "y"]


def test_the_owner_defaults_to_the_context():
    log: list[str] = []
    queue = JobQueue("t", threading.Lock())
    token = WORK_OWNER.set("key-1")
    try:
        queue.submit(steps("p", 2, log))
    finally:
        WORK_OWNER.reset(token)
    queue.submit(steps("q", 2, log))
    assert len(queue) == 2
    drain(queue)
    assert log == ["p", "q", "p", "q"]
