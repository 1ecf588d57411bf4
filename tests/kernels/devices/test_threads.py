"""kernels/devices/threads.py: the engine's BLAS thread count, malloc arenas and heap trim.

`configure` changes the BLAS pool of this whole test process: each test that calls it
puts the original limits and the module's state back afterwards."""

from __future__ import annotations

import os

import numpy as np  # noqa: F401  (loads the BLAS that configure limits)
import pytest

from kernels.devices import threads


@pytest.mark.parametrize(("cores", "expected"), [(1, 1), (2, 1), (8, 7)])
def test_default_threads_leaves_one_usable_core_to_the_rest(monkeypatch, cores, expected):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    assert threads.usable_cores() == cores
    assert threads.default_threads() == expected


def test_without_an_affinity_mask_the_machine_s_cores_count(monkeypatch):
    def no_affinity(pid):
        raise OSError("not supported here")

    monkeypatch.setattr(os, "sched_getaffinity", no_affinity, raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 4)
    assert threads.default_threads() == 3
    monkeypatch.setattr(os, "cpu_count", lambda: None)  # unknown: one core
    assert threads.default_threads() == 1


@pytest.fixture
def blas_restored(monkeypatch):
    """The BLAS limits and the module's state as they were before the test."""
    from threadpoolctl import threadpool_limits

    before = threads.blas_threads()
    if not before:
        pytest.skip("no BLAS library loaded that threadpoolctl can limit")
    monkeypatch.setattr(threads, "_state", dict(threads._state))
    yield before
    threadpool_limits(limits=max(before), user_api="blas")
    set_kernel_threads = getattr(threads, "_set_kernel_threads", None)  # the compiled pool
    if set_kernel_threads is not None:
        set_kernel_threads(max(before))


def test_configure_limits_blas_to_the_count_and_is_idempotent(blas_restored):
    assert threads.configure(1) == 1
    assert threads.blas_threads() and set(threads.blas_threads()) == {1}
    assert threads.configured() == 1
    limiter = threads._state["limiter"]
    assert threads.configure(1) == 1  # the same count again: nothing is redone
    assert threads._state["limiter"] is limiter
    assert set(threads.blas_threads()) == {1}

    assert threads.configure(2) == 2  # another count changes the limit
    assert set(threads.blas_threads()) == {2} and threads._state["limiter"] is not limiter


def test_configure_0_takes_the_default(blas_restored, monkeypatch):
    monkeypatch.setattr(threads, "default_threads", lambda: 1)
    assert threads.configure(0) == 1 and set(threads.blas_threads()) == {1}


def test_trim_returns_whether_it_trimmed_and_is_rate_limited(monkeypatch):
    if threads._libc() is None:
        pytest.skip("not glibc: nothing to trim")
    monkeypatch.setitem(threads._state, "last_trim", 0.0)
    now = [1000.0]
    monkeypatch.setattr(threads.time, "monotonic", lambda: now[0])
    assert threads.trim() is True
    now[0] += threads.TRIM_EVERY_S / 2
    assert threads.trim() is False  # too soon after the last
    assert threads.trim(force=True) is True  # unless forced
    now[0] += threads.TRIM_EVERY_S / 2
    assert threads.trim() is False  # the forced one counted as the last
    now[0] += threads.TRIM_EVERY_S
    assert threads.trim() is True


def test_trim_without_glibc_does_nothing(monkeypatch):
    monkeypatch.setattr(threads, "_libc", lambda: None)
    assert threads.trim() is False and threads.trim(force=True) is False


def test_the_compiled_pool_takes_every_core_by_default_and_the_setting_otherwise(
    blas_restored, monkeypatch
):
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    assert threads.configure(0) == 1  # BLAS: every core but one
    assert threads.kernel_threads() == 2  # the pool: every core
    assert threads.configure(1) == 1 and threads.kernel_threads() == 1  # a number sets both
    try:
        from kernels import _cpu
    except ImportError:
        return
    assert _cpu.get_threads() == 1


HEAP_PROBE = """
import sys
import numpy as np
from kernels.devices import threads
if sys.argv[1] == "tuned":
    threads._tune_heap()
def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096 / 2**20
big = np.ones(4 << 20, dtype=np.uint8)  # a big temporary, freed: glibc's threshold follows it
del big
before = rss_mb()
kept, temps = [], []
for _ in range(200):  # 300 KB temporaries between small objects that stay
    temps.append(np.ones(300 * 1024, dtype=np.uint8))
    kept.append(np.ones(2048, dtype=np.uint8))  # glibc malloc, not pymalloc
del temps
print(rss_mb() - before)
"""


@pytest.mark.skipif(threads._libc() is None, reason="not glibc: no mallopt to tune")
def test_freed_big_temporaries_leave_the_process_at_once():
    """With the threshold fixed, 60 MB of freed 300 KB temporaries go back to the OS even
    between small live objects; with glibc's moving threshold they stay in the heap."""
    import subprocess
    import sys

    def kept_mb(mode: str) -> float:
        run = subprocess.run(
            [sys.executable, "-c", HEAP_PROBE, mode],
            capture_output=True,
            text=True,
            check=True,
            cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(__file__)))),
        )
        return float(run.stdout.split()[-1])

    assert kept_mb("tuned") < 8
    assert kept_mb("stock") > 40  # the probe does show the difference
