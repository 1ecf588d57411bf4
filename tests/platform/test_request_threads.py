"""pantheon_platform/request_threads.py: a request's thread-sensitive calls run on kept
threads, one thread per request, and no request starts a thread."""

import asyncio
import json
import threading

import pytest
from asgiref.sync import sync_to_async
from django.core.handlers.asgi import ASGIHandler as DjangoASGIHandler

from pantheon_platform.request_memory import ASGIHandler
from pantheon_platform.request_threads import RequestThreads
from tests.wire.helpers import AsgiCall

BODY = json.dumps({"model": "nope", "content": "hello"}).encode()


def test_one_requests_sync_calls_share_a_thread_and_no_call_starts_one():
    threads = RequestThreads()

    async def one_request() -> set[int]:
        async with threads.lend():
            return {await sync_to_async(threading.get_ident)() for _ in range(3)}

    async def many():
        first = await one_request()  # the executor starts its thread on first use
        before = threading.active_count()
        seen = [await one_request() for _ in range(20)]
        return first, seen, before, threading.active_count()

    first, seen, before, after = asyncio.run(many())
    assert all(len(s) == 1 for s in [first, *seen])  # each request: one thread
    assert len(set().union(*seen)) == 1  # one at a time: the idle one, again and again
    assert after == before


def test_concurrent_requests_never_share_a_thread_and_some_are_kept():
    threads = RequestThreads(keep=3)
    n = 5  # more at once than are kept
    started = threading.Barrier(n, timeout=10)

    async def one_request() -> int:
        async with threads.lend():
            # Each waits for the others inside its sync call: they can only all arrive
            # if each request has a thread of its own.
            return await sync_to_async(lambda: (started.wait(), threading.get_ident())[1])()

    async def together():
        return await asyncio.gather(*(one_request() for _ in range(n)))

    assert len(set(asyncio.run(together()))) == n
    assert len(threads._idle) == 3  # the others ended


def served_thread_names(app, n: int) -> set[str]:
    """Names of the threads started while `n` requests go through `app`."""

    async def serve() -> list[int]:
        statuses = []
        for _ in range(n):
            call = AsgiCall(app, "/tokenize", BODY).start()
            await call.task
            statuses.append(call.status)
        return statuses

    names: set[str] = set()
    started = threading.Thread.start

    def noted(thread):  # thread names as they start, whether they still run or not
        names.add(thread.name)
        return started(thread)

    threading.Thread.start = noted
    try:
        statuses = asyncio.run(serve())
    finally:
        threading.Thread.start = started
    assert set(statuses) == {503}  # no model loaded: a round trip through the middleware
    return names


@pytest.mark.django_db
def test_the_handler_starts_no_thread_per_request(empty_runtime):
    ours = served_thread_names(ASGIHandler(), 12)
    # A kept thread's first use, the prepare pool's, asyncio's default executor and
    # asyncio.run's shutdown helper: a few, whatever the number of requests.
    per_request = [n for n in ours if not n.startswith(("pantheon-", "asyncio_"))]
    assert len(per_request) <= 1, sorted(ours)
    assert len([n for n in ours if n.startswith("pantheon-request-")]) == 1


@pytest.mark.django_db
def test_djangos_own_handler_starts_a_thread_per_request(empty_runtime):
    """The control: what request_threads exists for."""
    assert len(served_thread_names(DjangoASGIHandler(), 12)) >= 12
