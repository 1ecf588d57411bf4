"""pantheon_platform/request_memory.py: a served request and its response are freed when
it ends, not left in reference cycles for the collector's next full pass."""

import asyncio
import gc
import json
import logging

import pytest
from django.core.handlers.asgi import ASGIHandler as DjangoASGIHandler

from pantheon_platform.request_memory import ASGIHandler
from tests.wire.helpers import AsgiCall

BODY = json.dumps({"model": "nope", "content": "lorem ipsum " * 50_000}).encode()


class ClosedAtTheEnd(AsgiCall):
    """One request as Daphne serves it under the contract (`Connection: close`): the
    client's disconnect arrives as the response's last byte is sent."""

    async def _send(self, message):
        await super()._send(message)
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            self.hang_up.set()


def garbage_of(app) -> list[str]:
    """The type names of the objects one served request leaves to the cyclic collector."""

    async def served() -> int:
        call = ClosedAtTheEnd(app, "/tokenize", BODY).start()
        await call.task
        return call.status

    # Django logs the 503 with the request attached, and the test's log capture would
    # keep that record (and so the request) alive.
    quiet = logging.getLogger("django.request")
    gc.collect()
    gc.disable()
    gc.set_debug(gc.DEBUG_SAVEALL)
    quiet.disabled = True
    try:
        status = asyncio.run(served())
        gc.collect()
        kinds = [type(o).__name__ for o in gc.garbage]
    finally:
        quiet.disabled = False
        gc.set_debug(0)
        gc.garbage.clear()
        gc.enable()
    assert status == 503  # no model loaded: a whole round trip through the middleware
    return kinds


@pytest.mark.django_db
def test_a_served_request_leaves_nothing_to_the_collector(empty_runtime):
    kinds = garbage_of(ASGIHandler())
    assert "ASGIRequest" not in kinds
    assert not [k for k in kinds if k.endswith("Response")]


@pytest.mark.django_db
def test_djangos_own_handler_left_the_request_in_a_cycle(empty_runtime):
    """The control: what the handler above exists for (if Django fixes its handler, this
    fails, and request_memory.ASGIHandler can go)."""
    kinds = garbage_of(DjangoASGIHandler())
    assert "ASGIRequest" in kinds
    assert "JsonResponse" in kinds
