"""Graceful shutdown: on SIGTERM stop admitting, let in-flight generations finish, exit 0.

Daphne runs on Twisted, whose own SIGTERM handler stops the reactor at once, and Daphne
then cancels every open request: a stream in progress is cut off mid-answer. `install()`
(called from pantheon_site.asgi) replaces that handler once the reactor runs:

1. the first SIGTERM starts draining: new completions get 503 `server_shutting_down`
   with `Retry-After: 1`, every model stops admitting, and queued and running
   generations go on;
2. once nothing is in flight (or PANTHEON_DRAIN_TIMEOUT seconds have passed) the
   before-exit hooks run (`add_before_exit`: live sessions are spilled to disk), then the
   reactor stops after a short grace for the last bytes to leave, and Daphne exits with
   status 0;
3. a second SIGTERM stops at once (Daphne cancels what is still open).

POST /admin/shutdown starts the same drain (`request_shutdown`).
"""

from __future__ import annotations

import logging
import signal
import sys
import threading
import time
from collections.abc import Callable

log = logging.getLogger("pantheon.shutdown")

FLUSH_GRACE_S = 0.5  # after the last generation ends, for its final SSE chunks to be sent

_draining = threading.Event()
_reactor = None  # Daphne's, once it runs (install): what a requested shutdown stops
_before_exit: list[Callable[[], None]] = []
_on_drain: list[Callable[[], None]] = []


def draining() -> bool:
    return _draining.is_set()


def begin_drain() -> None:
    """Refuse new generations from now on (views and every loaded model), then run the
    on-drain hooks (add_on_drain)."""
    _draining.set()
    for svc in _services():
        svc.begin_drain()
    _run_hooks(_on_drain)


def add_on_drain(fn: Callable[[], None]) -> None:
    """Call `fn()` when a drain begins, before in-flight work is waited for (a serve
    instance deregisters from its router: cluster/heartbeat.py). An exception is logged."""
    _on_drain.append(fn)


def in_flight() -> int:
    """Requests admitted and not finished, over every live model (unloading ones too)."""
    return sum(svc.in_flight for svc in _services())


def _services() -> list:
    from pantheon_platform.runtime import get_runtime

    runtime = get_runtime()
    if hasattr(runtime, "instances"):  # the registry: unloading instances included
        found = [info.svc for info in runtime.instances()]
    else:
        found = list(runtime.services().values())
    return list({id(svc): svc for svc in found}.values())


def add_before_exit(fn: Callable[[], None]) -> None:
    """Call `fn()` once the SIGTERM drain is over, before the reactor stops (the sessions
    app spills live sessions to disk). An exception is logged; the exit goes on."""
    _before_exit.append(fn)


def _run_before_exit() -> None:
    _run_hooks(_before_exit)


def _run_hooks(hooks: list[Callable[[], None]]) -> None:
    for fn in list(hooks):
        try:
            fn()
        except Exception:
            log.exception("a shutdown hook failed")


def wait_drained(timeout: float, poll: float = 0.05) -> bool:
    """Block until no generation is in flight; False if `timeout` passed first."""
    deadline = time.monotonic() + timeout
    while in_flight() > 0:
        if time.monotonic() >= deadline:
            return False
        time.sleep(poll)
    return True


def install() -> None:
    """Take over SIGTERM once Daphne's reactor runs (no-op outside Daphne/Twisted)."""
    if "twisted.internet.reactor" not in sys.modules:
        return  # not under Daphne: importing the reactor here would install the wrong one
    from twisted.internet import reactor

    reactor.callWhenRunning(_take_sigterm, reactor)


def _take_sigterm(reactor) -> None:
    # Runs after Twisted installed its own handlers (they are set during startup).
    global _reactor
    _reactor = reactor
    signal.signal(signal.SIGTERM, lambda signum, frame: _on_sigterm(reactor))


def request_shutdown() -> bool:
    """POST /admin/shutdown: the drain a SIGTERM starts, begun from a request's thread.
    False when this process is not Daphne's (nothing would stop it); True once a drain
    runs (this one or an earlier one)."""
    reactor = _reactor
    if reactor is None:
        return False
    if not draining():
        _start_drain(reactor, "POST /admin/shutdown")
    return True


def _on_sigterm(reactor) -> None:
    # A signal handler interrupts the main thread anywhere, maybe inside a lock (the
    # runtime's, logging's): set the flag the views read, and do the rest on a thread.
    if draining():
        reactor.callFromThread(reactor.stop)
        return
    _start_drain(reactor, "SIGTERM")


def _start_drain(reactor, why: str) -> None:
    _draining.set()
    threading.Thread(
        target=_drain_then_stop, args=(reactor, why), name="pantheon-drain", daemon=True
    ).start()


def _drain_then_stop(reactor, why: str = "SIGTERM") -> None:
    from pantheon_platform import live_settings

    timeout = float(live_settings.value("drain_timeout_s"))
    begin_drain()
    log.warning("%s: draining %d in-flight requests (up to %.0f s)", why, in_flight(), timeout)
    if wait_drained(timeout):
        log.warning("drained; exiting")
    else:
        log.warning("drain timeout: exiting with %d requests in flight", in_flight())
    _run_before_exit()
    time.sleep(FLUSH_GRACE_S)
    reactor.callFromThread(reactor.stop)
