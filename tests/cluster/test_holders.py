"""Where the router sends a request whose session or stored response lives on an
instance that is restarting (cluster/dispatch.py Dispatcher.place), on an in-memory
registry: a session's own route waits for its instance rather than act on a replica that
does not hold it; a turn re-homes at once; a holder process that failed the request is
waited for until its restart."""

from __future__ import annotations

import asyncio
import threading
from types import SimpleNamespace

import pytest

from cluster import dispatch
from cluster.registry import Instance, ModelReport

pytestmark = pytest.mark.anyio


def inst(name: str, started_at: float = 1.0, serving: bool = True, **kw) -> Instance:
    models = (ModelReport("m", 4, 4, 0, 4, 0, "w1", 8192),) if serving else ()
    return Instance(name, f"http://{name}", started_at, 1.0, models, **kw)


class Registry:
    """The calls Dispatcher.place makes, over a list a test changes as it goes."""

    def __init__(self, instances, sessions=None, responses=None):
        self.list, self.lock = list(instances), threading.Lock()
        self.sessions, self.responses = sessions or {}, responses or {}

    def instances(self):
        with self.lock:
            return list(self.list)

    def replace(self, *instances):
        with self.lock:
            self.list = list(instances)

    def session_instance(self, namespace, session_id):
        return self.sessions.get(session_id)

    def response_instance(self, namespace, response_id):
        return self.responses.get(response_id)


@pytest.fixture
def registry(monkeypatch, settings):
    settings.PANTHEON_HOLDER_WAIT_S = 3.0
    monkeypatch.setattr(dispatch, "HOLDER_POLL_S", 0.02)
    reg = Registry([])
    monkeypatch.setattr(dispatch, "get_registry", lambda: reg)
    return reg


def target(path: str, session_id=None, response_id=None):
    return SimpleNamespace(
        path=path,
        namespace="ns",
        model=None,
        session_id=session_id,
        response_id=response_id,
        rehomed=False,
    )


async def later(seconds: float, action) -> None:
    await asyncio.sleep(seconds)
    action()


async def test_a_sessions_route_waits_for_its_restarting_instance(registry):
    registry.replace(inst("a", 2.0, serving=False), inst("b"))  # a: restarted, loading
    registry.sessions["s1"] = "a"
    back = asyncio.ensure_future(later(0.3, lambda: registry.replace(inst("a", 2.0), inst("b"))))
    chosen = await dispatch.Dispatcher().place(target("/session/release", "s1"), {})
    await back
    assert chosen.id == "a"


async def test_a_sessions_route_goes_anywhere_once_its_instance_is_gone(registry):
    registry.replace(inst("b"))
    registry.sessions["s1"] = "a"
    assert (await dispatch.Dispatcher().place(target("/session/release", "s1"), {})).id == "b"
    # Dropped while the route waited: it stops waiting.
    registry.replace(inst("a", 2.0, serving=False), inst("b"))
    gone = asyncio.ensure_future(later(0.2, lambda: registry.replace(inst("b"))))
    chosen = await dispatch.Dispatcher().place(target("/session/release", "s1"), {})
    await gone
    assert chosen.id == "b"


async def test_a_turn_of_a_session_whose_instance_is_loading_re_homes_at_once(registry):
    registry.replace(inst("a", 2.0, serving=False), inst("b"))
    registry.sessions["s1"] = "a"
    turn = target("/v1/chat/completions", "s1")
    assert (await dispatch.Dispatcher().place(turn, {})).id == "b"
    assert turn.rehomed


async def test_a_holder_that_failed_the_request_is_waited_for_until_its_restart(registry):
    registry.replace(inst("a", 1.0), inst("b"))
    registry.responses["resp_1"] = "a"
    tried = {"a": 1.0}  # that process failed it; its registration has not lapsed yet
    restart = asyncio.ensure_future(later(0.3, lambda: registry.replace(inst("a", 5.0), inst("b"))))
    chosen = await dispatch.Dispatcher().place(target("/v1/responses", response_id="resp_1"), tried)
    await restart
    assert (chosen.id, chosen.started_at) == ("a", 5.0)
