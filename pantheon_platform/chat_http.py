"""The Django side of the chat core, shared by every wire format's view.

A chat view (OpenAI chat, Anthropic Messages, OpenAI Responses) parses and validates its
JSON off the event loop (`off_loop`, within `turn_deadline()`), builds an engine `Turn`,
and calls `start_turn`: the model resolved, the session id put in the caller's key's
namespace, the access log told, the turn prepared on the bounded prepare pool within the
same deadline. It then renders the events of `StartedTurn.events`.

Nothing a client sends runs unbounded on the event loop: past PREPARE_TIMEOUT_S a
preparation is 413 request_too_large, or 429 server_busy if it never got a worker.
"""

from __future__ import annotations

import asyncio
import math
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import aclosing
from dataclasses import dataclass, replace
from typing import TypeVar

from django.conf import settings

from engine import (
    ChatOptions,
    FinishEvent,
    GenerationFailed,
    PreparedTurn,
    Turn,
    prepare_turn,
    run_turn,
)
from pantheon_platform import live_settings, tenancy
from pantheon_platform.discovery import load_if_discovered
from pantheon_platform.errors import ApiError
from pantheon_platform.fair_pool import FairPool
from pantheon_platform.metering import TurnRecord, metered, note_turn
from pantheon_platform.request_log import note
from pantheon_platform.runtime import get_runtime

T = TypeVar("T")

# A request's preparation (parse, validate, render, tokenize) must end within this; past
# it the client gets 413 request_too_large (or 429 server_busy if it never got a worker).
PREPARE_TIMEOUT_S = 10.0
PREPARE_WORKERS = 4
# Shared fairly between keys (pantheon_platform/fair_pool.py): one key runs on one
# worker at a time (preparation holds the GIL for much of its time, so a key gains
# little from more, and a flood of huge bodies from it takes one core's worth at most),
# and a key running nothing gets one of PREPARE_BURST extra threads when all are busy.
PREPARE_PER_KEY = 1
PREPARE_BURST = 4
PREPARE_NICE = 5  # below the engine's threads: parsing waits, streams do not
_prepare_pool = FairPool(
    PREPARE_WORKERS,
    PREPARE_PER_KEY,
    PREPARE_BURST,
    thread_name_prefix="pantheon-prepare",
    nice=PREPARE_NICE,
)


def turn_deadline() -> float:
    """The deadline (time.monotonic()) a request's whole preparation must meet: take it
    before parsing the body."""
    return time.monotonic() + PREPARE_TIMEOUT_S


async def off_loop(deadline: float, work: Callable[[], T]) -> T:
    """`work()` on the prepare pool, awaited until `deadline` (time.monotonic()). The
    pool is bounded: a flood of large requests queues there, never on the event loop. A
    job still queued when its request gives up never starts; one already running cannot
    be stopped, but ends on its own (every step of it is bounded by a limit)."""
    started = threading.Event()

    def run() -> T:
        started.set()
        return work()

    future = _prepare_pool.submit(run)
    try:
        return await asyncio.wait_for(
            asyncio.wrap_future(future), max(0.0, deadline - time.monotonic())
        )
    except TimeoutError:
        future.cancel()
        if not started.is_set():
            raise ApiError(
                429,
                f"the server is busy preparing other requests (none started within "
                f"{PREPARE_TIMEOUT_S:g} s); retry later",
                "server_busy",
                headers={"Retry-After": str(math.ceil(PREPARE_TIMEOUT_S))},
            ) from None
        raise ApiError(
            413,
            f"preparing this request (parsing, the chat template, tokenizing) took longer "
            f"than {PREPARE_TIMEOUT_S:g} s; send a smaller one",
            "request_too_large",
        ) from None


def chat_options() -> ChatOptions:
    """The settings that shape a turn (no_think, tool_grammar: the runtime config, else
    PANTHEON_NO_THINK and PANTHEON_TOOL_GRAMMAR)."""
    return ChatOptions(
        no_think=live_settings.value("no_think"),
        tool_grammar=live_settings.TOOL_GRAMMAR_MODES[live_settings.value("tool_grammar")],
    )


@dataclass(frozen=True)
class StartedTurn:
    model: str  # the served name the request resolved to
    svc: object  # its ModelService
    prepared: PreparedTurn
    # The engine's events; not started yet: the first `anext` admits the request (and
    # raises its refusals). Close it (aclosing) when done: that stops the generation.
    events: AsyncIterator
    record: TurnRecord  # what the metrics and usage stats read (pantheon_platform.metering)

    @property
    def session_id(self) -> str | None:
        return self.prepared.turn.session_id

    def rerun(self, prepared: PreparedTurn) -> StartedTurn:
        """The turn started again as `prepared` (the old events closed, never admitted),
        metered in the same record."""
        return replace(self, prepared=prepared, events=_events(self.record, self.svc, prepared))


async def start_turn(
    request,
    turn: Turn,
    *,
    model: str | None,
    session_id: str | None,
    deadline: float,
) -> StartedTurn:
    """Resolve `model`, namespace the client's `session_id` (None: no session) through
    sessions.tenancy, note both for the access log, prepare `turn` off the loop within
    `deadline`, and hand back its (not yet started) event stream. Raises the runtime's
    ModelNotFound / NoModelsLoaded, ApiError (429/413 from the prepare pool),
    InvalidTurn and ContextOverBudget."""
    await load_if_discovered(model)  # a model on disk (PANTHEON_DISCOVER) loads on first use
    name, svc = get_runtime().resolve(model)
    # In the caller's key's namespace: another key's session of that id is not reached.
    key = tenancy.session_key(request, session_id)
    note(request, model=name, session_id=key)
    turn = replace(turn, session_id=key, cache_namespace=tenancy.namespace(request))
    if tenancy.priority(request) == tenancy.BATCH:  # a batch line (wire/batches)
        turn = replace(turn, priority=tenancy.BATCH)
    options = chat_options()
    prepared = await off_loop(deadline, lambda: prepare_turn(svc, turn, options))
    record = TurnRecord(name, len(prepared.request.prompt_ids))
    note_turn(request, record)
    return StartedTurn(name, svc, prepared, _events(record, svc, prepared), record)


def _events(record: TurnRecord, svc, prepared: PreparedTurn) -> AsyncIterator:
    """The turn's engine events, kept in `record` for the metrics unless they are off
    (PANTHEON_METRICS=0: the events as the engine gives them)."""
    events = run_turn(svc, prepared)
    return metered(record, events) if getattr(settings, "PANTHEON_METRICS", True) else events


async def one_choice(events: AsyncIterator, on_token: Callable[[object], object]) -> FinishEvent:
    """A one-choice turn's events to its end: each TokenEvent to `on_token`, its
    FinishEvent returned (GenerationFailed if none came). Closed however it ends: a view
    cancelled (client gone) stops the generation."""
    finish: FinishEvent | None = None
    async with aclosing(events):
        async for event in events:
            if isinstance(event, FinishEvent):
                finish = event
            else:
                on_token(event)
    if finish is None:
        raise GenerationFailed("the engine stream ended without a finish event")
    return finish
