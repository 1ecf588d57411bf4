"""POST /v1/messages and POST /v1/messages/count_tokens: Anthropic's Messages API as a
thin adapter on the chat core (parse -> Turn -> start_turn -> render the events).

Every error on these routes has Anthropic's shape (`{"type": "error", "error": {"type",
"message"}}`); once a stream has opened, an error is its `event: error`.
"""

from __future__ import annotations

import logging
import secrets
from collections.abc import AsyncIterator
from dataclasses import replace

from django.http import HttpRequest, HttpResponse

from engine import FinishEvent, GenerationFailed, TokenEvent, prepare_turn
from pantheon_platform import tenancy
from pantheon_platform.chat_http import (
    StartedTurn,
    chat_options,
    off_loop,
    one_choice,
    start_turn,
    turn_deadline,
)
from pantheon_platform.errors import json_response
from pantheon_platform.request_log import note
from pantheon_platform.runtime import get_runtime
from pantheon_platform.sse import EventStreamResponse
from pantheon_platform.strict_json import parse_json_object
from wire.anthropic.render import (
    Blocks,
    anthropic_error,
    error_event,
    error_response,
    message_json,
    sse_event,
    stop_reason,
    usage_json,
)
from wire.anthropic.request import MessagesRequest, parse_messages_request
from wire.route import ErrorShape, RouteCall, first_event, post_route

log = logging.getLogger("pantheon.http")


def _parse(request: HttpRequest, count_only: bool) -> MessagesRequest:
    return parse_messages_request(
        parse_json_object(request.body),
        count_only=count_only,
        header_session=request.headers.get("X-Session-Id"),
    )


# Anthropic's shape: {"type": "error", "error": {"type", "message"}}.
ANTHROPIC_ERRORS = ErrorShape(
    error_of=lambda exc, stream: anthropic_error(exc), respond=error_response
)


@post_route(ANTHROPIC_ERRORS, "anthropic messages request failed")
async def messages(request: HttpRequest, call: RouteCall) -> HttpResponse:
    """Async: a generation waits on the engine without holding a worker thread."""
    deadline = turn_deadline()
    parsed = await off_loop(deadline, lambda: _parse(request, count_only=False))
    message_id = f"msg_{secrets.token_hex(12)}"
    started = await start_turn(
        request,
        replace(parsed.turn(None), request_id=message_id),
        model=parsed.model,
        session_id=parsed.session_id,
        deadline=deadline,
    )
    if parsed.stream:
        first = await first_event(started.events)
        return EventStreamResponse(_events(started, message_id, first))
    return await _complete(started, message_id)


@post_route(ANTHROPIC_ERRORS, "anthropic messages request failed", drain=False)
async def count_tokens(request: HttpRequest, call: RouteCall) -> HttpResponse:
    """The prompt the request would be: the chat template rendered and tokenized by the
    core (tools and thinking included), nothing generated."""
    deadline = turn_deadline()
    parsed = await off_loop(deadline, lambda: _parse(request, count_only=True))
    name, svc = get_runtime().resolve(parsed.model)
    note(request, model=name, session_id=tenancy.session_key(request, parsed.session_id))
    turn = parsed.turn(None)
    prepared = await off_loop(deadline, lambda: prepare_turn(svc, turn, chat_options()))
    return json_response({"input_tokens": prepared.prompt_tokens})


# --- rendering ---------------------------------------------------------------------------


async def _complete(started: StartedTurn, message_id: str) -> HttpResponse:
    blocks = Blocks()
    finish = await one_choice(started.events, blocks.push)
    body = message_json(
        message_id, started.model, blocks.content(finish), finish, usage_json(finish.usage)
    )
    return json_response(body)


async def _events(
    started: StartedTurn, message_id: str, first: TokenEvent | FinishEvent
) -> AsyncIterator[bytes]:
    events = started.events
    start = message_json(message_id, started.model, [], None, _start_usage(started))
    yield sse_event("message_start", {"type": "message_start", "message": start})
    yield sse_event("ping", {"type": "ping"})
    blocks = Blocks()
    finish: FinishEvent | None = None
    try:
        event: TokenEvent | FinishEvent | None = first
        while event is not None:
            if isinstance(event, FinishEvent):
                finish = event
            else:
                for name, payload in blocks.push(event):
                    yield sse_event(name, payload)
            event = await anext(events, None)
    except Exception as exc:
        # The status line is gone: Anthropic ends such a stream with an error event.
        error = anthropic_error(exc)
        if error.status == 500:
            log.error("anthropic stream %s failed after it opened", message_id, exc_info=exc)
        for name, payload in blocks.close():
            yield sse_event(name, payload)
        yield error_event(error)
        return
    finally:
        # On normal end, on failure, and when the client disconnects: the engine stops.
        await events.aclose()
    for name, payload in blocks.close():
        yield sse_event(name, payload)
    if finish is None:
        yield error_event(
            anthropic_error(GenerationFailed("the engine stream ended without a finish event"))
        )
        return
    reason, sequence = stop_reason(finish)
    yield sse_event(
        "message_delta",
        {
            "type": "message_delta",
            "delta": {"stop_reason": reason, "stop_sequence": sequence},
            "usage": usage_json(finish.usage),
        },
    )
    yield sse_event("message_stop", {"type": "message_stop"})


def _start_usage(started: StartedTurn) -> dict:
    """message_start's usage: the prompt as prepared; what the session cache supplied is
    known when the turn ends (message_delta's usage carries the final counts)."""
    return {
        "input_tokens": started.prepared.prompt_tokens,
        "output_tokens": 0,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }
