"""What a generation request produced, for the metrics and the usage stats (observability/).

`chat_http.start_turn` passes each turn's engine events through `metered`, which keeps
the turn's FinishEvents (their usage is what the response reports, and they carry the
engine's timings) in a TurnRecord noted in the request's access-log dict
(request_log.SCOPE_KEY). The access log, the one layer that sees every request end, hands
the dict to observability once. The platform itself records nothing and imports no app.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field

from engine import FinishEvent, request_usage
from pantheon_platform.request_log import SCOPE_KEY

TURNS_KEY = "turns"  # in the access-log dict: the request's TurnRecords, in order


@dataclass
class TurnRecord:
    """One turn of a request (a /v1/completions request of several prompts has several)."""

    model: str  # the served name
    prompt_tokens: int  # the prepared prompt's length (before any prefix cache)
    pulled_at: float | None = None  # time.perf_counter() when the engine got the turn
    finishes: dict[int, FinishEvent] = field(default_factory=dict)  # by choice index
    streamed: Counter = field(default_factory=Counter)  # token ids seen, by choice index

    @property
    def started(self) -> bool:
        return self.pulled_at is not None

    def tokens(self) -> tuple[int, int, int]:
        """(prompt, cached prompt, generated) tokens: the response's usage when every
        choice finished; a turn cut short (client gone) counts the prompt and the tokens
        streamed of its unfinished choices; a turn never admitted counts nothing."""
        unfinished = sum(n for i, n in self.streamed.items() if i not in self.finishes)
        if self.finishes:
            usage = request_usage(self.finishes)
            return usage.prompt_tokens, usage.cached_tokens, usage.completion_tokens + unfinished
        if unfinished:
            return self.prompt_tokens, 0, unfinished
        return 0, 0, 0

    def first_token_at(self) -> float | None:
        """time.perf_counter() of the turn's first token (any choice), on the engine's
        clock carried over: when the engine got the turn plus its first_token_s."""
        if self.pulled_at is None or not self.finishes:
            return None
        return self.pulled_at + min(f.first_token_s for f in self.finishes.values())


def note_turn(request, record: TurnRecord) -> None:
    """Put `record` in the request's access-log dict (nothing without an ASGI scope: a
    test client, where no access log runs)."""
    scope = getattr(request, "scope", None)
    if isinstance(scope, dict):
        scope.setdefault(SCOPE_KEY, {}).setdefault(TURNS_KEY, []).append(record)


async def metered(record: TurnRecord, events: AsyncIterator) -> AsyncIterator:
    """`events` unchanged, their finishes and streamed token counts kept in `record`.
    Closing it closes `events` (which stops the generation)."""
    record.pulled_at = time.perf_counter()
    async with aclosing(events):
        async for event in events:
            if isinstance(event, FinishEvent):
                record.finishes[event.index] = event
            else:
                record.streamed[event.index] += len(event.token_ids)
            yield event
