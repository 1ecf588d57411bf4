"""Who gets into a model instance, and when to come back: the refusals a request meets
before it reaches the queue (shutting down, empty, past the window, past the memory the
ladder leaves, no session slot), the queue's own back-pressure (full: ServerBusy, or
ServerMemoryConstrained under critical memory pressure) and the Retry-After seconds that
go with them."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ..types import (
    ContextOverBudget,
    GenerationFailed,
    ServerBusy,
    ServerMemoryConstrained,
    ServerShuttingDown,
    SessionCapacity,
)
from .memory import CRITICAL, MemoryLadder
from .scheduler import QueueFull, Scheduler

if TYPE_CHECKING:
    from .loop import EngineLoop
    from .records import EngineRequest, EngineStats

MAX_RETRY_AFTER_S = 30
FALLBACK_PREFILL_TOK_PER_S = 100.0  # estimates before a prefill rate is measured


def retry_after_s(scheduler: Scheduler, stats: EngineStats) -> int:
    """Seconds until a request arriving now would likely get a slot: the scheduler's
    estimate (until a slot frees, plus a turnover of the slots per `served_slots`
    requests queued ahead) times the measured step time, between 1 and 30. Called under
    the engine loop's lock."""
    steps = scheduler.steps_until_admitted()
    step_s = stats.decode_step_s or 0.05
    return max(1, min(MAX_RETRY_AFTER_S, math.ceil(steps * step_s)))


class Admission:
    def __init__(self, name: str, engine: EngineLoop, ladder: MemoryLadder, kv, window: int):
        self.name = name
        self.engine = engine
        self.ladder = ladder
        self.kv = kv
        self.context_window_configured = window
        self.draining = False

    def begin_drain(self) -> None:
        """Admit nothing new (ServerShuttingDown); queued and running requests finish."""
        self.draining = True

    def check_open(self) -> None:
        if self.draining:
            raise ServerShuttingDown(f"model {self.name!r} is shutting down; retry elsewhere")

    def check(self, n_prompt: int) -> None:
        """Refuse a prompt of `n_prompt` tokens now, or let it through to the queue."""
        self.check_open()
        if n_prompt == 0:
            raise GenerationFailed("empty prompt")
        if n_prompt > self.context_window_configured:
            raise ContextOverBudget(n_prompt, self.context_window_configured)
        window = self.ladder.window
        if n_prompt > window:
            raise ServerMemoryConstrained(
                f"memory pressure: the context window is down to {window} tokens "
                f"(configured {self.context_window_configured}) and the prompt is "
                f"{n_prompt}; retry later",
                self.retry_after(),
            )
        needed = n_prompt * self.kv.bytes_per_token()
        available = self.ladder.available_bytes()
        if needed > available:
            raise ServerMemoryConstrained(
                f"memory pressure: the prompt's KV needs {needed >> 20} MiB and only "
                f"{available >> 20} MiB is free; retry later",
                self.retry_after(),
            )

    def begin_session_turn(self, session_id: str, n_prompt: int, *, implicit: bool) -> None:
        try:
            self.engine.sessions.begin_turn(session_id, implicit=implicit)
        except SessionCapacity as exc:
            seconds, rate, measured = self.estimate_prefill_s(n_prompt)
            raise SessionCapacity(
                f"model {self.name!r}: {exc}; release one (POST /session/release) or retry "
                f"in {SessionCapacity.retry_after} s. Served without a session, this "
                f"{n_prompt}-token prompt would re-prefill in about {seconds:.1f} s "
                f"({rate:.0f} tokens/s{' measured' if measured else ', not yet measured'})."
            ) from None

    def enqueue(self, req: EngineRequest, n: int, session_id: str | None) -> None:
        """Queue `req` (`n` choices) for the engine thread. A full queue refuses it (the
        session turn begun for it ends), with the Retry-After seconds."""
        engine, request = self.engine, req.request
        with engine.lock:
            try:
                req.group_id = engine.scheduler.add(
                    request.prompt_ids,
                    n,
                    request.params.max_tokens,
                    request.cache_namespace,
                    request.priority,
                    session_id,
                )
            except QueueFull as exc:
                if session_id is not None:
                    engine.sessions.end_turn(session_id)
                retry = retry_after_s(engine.scheduler, engine.stats)
                if self.ladder.level == CRITICAL:
                    raise ServerMemoryConstrained(
                        f"memory pressure is critical and the queue is full ({exc})", retry
                    ) from None
                raise ServerBusy(f"model {self.name!r} is busy: {exc}", retry) from None
            engine.requests[req.group_id] = req
        engine.wake.set()

    def retry_after(self) -> int:
        with self.engine.lock:
            return retry_after_s(self.engine.scheduler, self.engine.stats)

    def set_queue_limits(self, depth: int, timeout_s: float) -> None:
        """A new queue depth and timeout (the runtime config), from the next request on:
        requests already queued keep their place."""
        with self.engine.lock:
            self.engine.scheduler.queue_depth = max(0, depth)
            self.engine.scheduler.queue_timeout_s = timeout_s

    def estimate_prefill_s(self, tokens: int) -> tuple[float, float, bool]:
        """(seconds to prefill `tokens` cold, the rate used, whether it was measured)."""
        measured = self.engine.stats.prefill_tok_per_s
        rate = measured or FALLBACK_PREFILL_TOK_PER_S
        return tokens / rate, rate, bool(measured)
