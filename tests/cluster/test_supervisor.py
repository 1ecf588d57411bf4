"""The local cluster's supervisor (cluster/supervisor.py) on stand-in processes (sleeping
Pythons): a dead process is started again with a growing delay, and SIGTERM stops all."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from cluster.supervisor import Supervisor

pytestmark = pytest.mark.timeout(60)


def sleeper() -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"])


def wait_until(condition, timeout=20.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return
        time.sleep(0.02)
    pytest.fail("timed out")


def test_a_dead_process_is_started_again_with_a_doubling_delay():
    now = [0.0]
    supervisor = Supervisor(first_delay_s=1.0, max_delay_s=3.0, clock=lambda: now[0])
    instance = supervisor.add("instance 1", sleeper)
    other = supervisor.add("instance 2", sleeper)
    try:
        for expected_delay in (1.0, 2.0, 3.0, 3.0):  # doubling, capped
            dead = instance.proc
            dead.kill()
            dead.wait()
            supervisor.tick()
            assert instance.proc is dead  # not before its delay is over
            now[0] += expected_delay - 0.01
            supervisor.tick()
            assert instance.proc is dead
            now[0] += 0.01
            supervisor.tick()
            assert instance.proc is not dead and instance.proc.poll() is None
        assert instance.restarts == 4 and other.restarts == 0
        # Once it has run a minute, a failure starts over at the first delay.
        now[0] += 60
        instance.proc.kill()
        instance.proc.wait()
        supervisor.tick()
        assert instance.restart_at == now[0] + 1.0
    finally:
        supervisor.stop()
    assert instance.proc.poll() is not None and other.proc.poll() is not None


def test_sigterm_stops_every_process():
    supervisor = Supervisor()
    children = [supervisor.add(f"p{n}", sleeper) for n in range(2)]
    # run() installs its SIGTERM handler on the main thread only: call it there.
    previous = signal.getsignal(signal.SIGTERM)
    timer = threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGTERM))
    timer.start()
    supervisor.run(poll_s=0.05)
    assert signal.getsignal(signal.SIGTERM) == previous
    assert all(c.proc.poll() is not None for c in children)
