"""What the engine thread keeps per request and per choice, and its measured rates."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..decoding.output import ChoiceOutput
from ..decoding.state import DecodeState
from ..types import GenerationRequest, TokenEvent
from .sessions import Resume
from .speculation import Drafter


@dataclass(eq=False)
class EngineRequest:
    """One admitted request, as the engine thread sees it."""

    request: GenerationRequest
    emit: Callable[[object], None]
    group_id: int = 0
    closed: bool = False  # its client is gone (or it failed): drop its events
    resume: Resume = Resume()  # where its prompt resumed from (session turns)
    # time.monotonic() when it reached the engine and when its slots were given (metrics)
    arrived_at: float = field(default_factory=time.monotonic)
    admitted_at: float | None = None
    # A step's token events wait here (`post`) and leave together (`flush`, or the
    # engine loop's `hand_over` for all of a step's requests): one wake-up of the event
    # loop per step, not one per token (a verify pass emits up to 8 of them) nor one per
    # stream, and a choice's answer text of one step in one event (`joined`), so one
    # chunk on the wire, as vLLM streams a verified draft. `handoff`: (the event loop, a
    # function taking a list of events there); None: `emit` each.
    handoff: tuple[Any, Callable[[list], None]] | None = None
    outbox: list = field(default_factory=list)
    # time.monotonic() of its last paced hand-over (`hand_over_due`; 0: none yet)
    handed_at: float = 0.0

    def post(self, event: object) -> None:
        if self.outbox and (both := joined(self.outbox[-1], event)) is not None:
            self.outbox[-1] = both
        else:
            self.outbox.append(event)

    def flush(self) -> None:
        hand_over([self])

    def send(self, event: object) -> None:
        """`event` now, after what was posted before it."""
        self.flush()
        self.emit(event)


def hand_over_due(posted: list[EngineRequest], interval_s: float) -> list[EngineRequest]:
    """Hand over the posted events of the requests whose last hand-over is at least
    `interval_s` old (a request's first is always due); the others keep theirs, joined
    with what they post next. Returns the requests still holding events."""
    if interval_s <= 0:
        hand_over(posted)
        return []
    now = time.monotonic()
    due = []
    for req in posted:
        if now - req.handed_at >= interval_s:
            req.handed_at = now
            due.append(req)
    hand_over(due)
    return [req for req in posted if req.outbox]


def hand_over(posted: list[EngineRequest]) -> None:
    """Hand each request its posted events: those with a `handoff` in one
    call_soon_threadsafe per event loop (a write to its self-pipe, and the loop wakes
    once for the step's streams), the others `emit` each."""
    by_loop: dict[Any, list] = {}
    for req in posted:
        events, req.outbox = req.outbox, []
        if not events:
            continue
        if req.handoff is None:
            for event in events:
                req.emit(event)
        else:
            loop, put_all = req.handoff
            by_loop.setdefault(loop, []).append((req, put_all, events))
    for loop, parts in by_loop.items():
        try:
            loop.call_soon_threadsafe(_put_parts, parts)
        except RuntimeError:  # the loop is gone: nobody is listening any more
            for req, _, _ in parts:
                req.closed = True


def _put_parts(parts: list) -> None:
    for _, put_all, events in parts:
        put_all(events)


def joined(first: object, then: object) -> TokenEvent | None:
    """Two answer-text events of one choice as one, or None where they stay apart: another
    choice's, or reasoning or tool-call deltas, whose order against the text a renderer
    reads from the event boundaries."""
    if not (isinstance(first, TokenEvent) and isinstance(then, TokenEvent)):
        return None
    if first.index != then.index:
        return None
    if first.reasoning or then.reasoning or first.tool_calls or then.tool_calls:
        return None
    return TokenEvent(
        text=first.text + then.text,
        token_ids=first.token_ids + then.token_ids,
        index=first.index,
        logprobs=first.logprobs + then.logprobs,
    )


@dataclass(eq=False)
class Choice:
    """Decode and output state of one choice (one sequence); the engine thread's alone."""

    req: EngineRequest
    index: int
    state: DecodeState  # how its next token is chosen
    out: ChoiceOutput  # what its tokens become for the client
    stopped: str | None = None  # the reason it was ended early (stop string, loop, grammar)
    first_token_at: float | None = None  # time.monotonic() of its first sampled token
    drafter: Drafter | None = None  # its speculation drafts (None: it decodes one by one)

    @property
    def token_ids(self) -> list[int]:
        return self.out.token_ids

    def timings(self) -> dict[str, float]:
        """Its times for its FinishEvent (queue_wait_s, first_token_s, decode_s); a choice
        that sampled no token has a first token "now"."""
        now = time.monotonic()
        req = self.req
        first = self.first_token_at if self.first_token_at is not None else now
        admitted = req.admitted_at if req.admitted_at is not None else req.arrived_at
        return {
            "queue_wait_s": admitted - req.arrived_at,
            "first_token_s": first - req.arrived_at,
            "decode_s": now - first,
        }


@dataclass
class EngineStats:
    """Measured rates, for estimates and /admin views. Written by the engine thread only."""

    prefill_tok_per_s: float = 0.0
    decode_tok_per_s: float = 0.0  # all sequences together, over the last decode step
    decode_step_s: float = 0.0  # smoothed seconds per decode step
    generations: int = 0
    # Speculative decoding (serving/speculation.py), all drafts (context and prediction):
    # tokens proposed for verification, and those verified and emitted.
    drafted_tokens: int = 0
    accepted_draft_tokens: int = 0
    model_drafted_tokens: int = 0  # of those, the draft model's (serving/draft_model.py)
    model_accepted_tokens: int = 0

    def note_times(self, t, costs) -> None:
        """A step's StepTimes (runner.py) into the rates and the speculator's PassCosts."""
        if t.prefill_tokens >= 32 and t.prefill_s > 0:
            self.prefill_tok_per_s = t.prefill_tokens / t.prefill_s
        if t.pass_rows and t.decode_s > 0:
            costs.observe(t.pass_rows, t.decode_s)
        if t.decode_rows and t.decode_s > 0:
            self.decode_tok_per_s = t.decode_rows / t.decode_s
            prev = self.decode_step_s
            self.decode_step_s = t.decode_s if not prev else 0.8 * prev + 0.2 * t.decode_s
