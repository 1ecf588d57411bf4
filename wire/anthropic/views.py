"""POST /v1/messages and POST /v1/messages/count_tokens: Anthropic's Messages API as a
thin adapter on the chat core (parse -> Turn -> start_turn -> render the events).

Every error on these routes has Anthropic's shape (`{"type": "error", "error": {"type",
"message"}}`); once a stream has opened, an error is its `event: error`.
"""

from __future__ import annotations

import secrets
from dataclasses import replace

from django.http import HttpRequest, HttpResponse

from engine import prepare_turn
from pantheon_platform import tenancy
from pantheon_platform.chat_http import chat_options, off_loop, start_turn, turn_deadline
from pantheon_platform.errors import json_response
from pantheon_platform.request_log import note
from pantheon_platform.runtime import get_runtime
from pantheon_platform.sse import EventStreamResponse
from pantheon_platform.strict_json import parse_json_object
from wire.anthropic.render import anthropic_error, complete, error_response, stream_events
from wire.anthropic.request import MessagesRequest, parse_messages_request
from wire.route import ErrorShape, RouteCall, first_event, post_route


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
        return EventStreamResponse(stream_events(started, message_id, first))
    return await complete(started, message_id)


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
