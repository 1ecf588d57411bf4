"""POST /v1/chat/completions (GET /, /v1/models and the other meta routes: wire.meta).

Views validate, call the runtime/engine, render. No tensor or tokenizer code here, and no
generation logic: a chat request becomes the chat core's Turn (engine.chat),
started through pantheon_platform.chat_http and rendered by wire.openai_chat.render.
"""

from __future__ import annotations

from django.http import HttpRequest, HttpResponse

from pantheon_platform.chat_http import off_loop, start_turn, turn_deadline
from wire.openai_chat import render as openai_chat
from wire.openai_chat.request import validated_chat_request
from wire.route import OPENAI_ERRORS, RouteCall, first_event, post_route

# --- POST /v1/chat/completions ------------------------------------------------------


@post_route(OPENAI_ERRORS, "chat completion failed")
async def chat_completions(request: HttpRequest, call: RouteCall) -> HttpResponse:
    """Async, so that a generation waits on the engine without holding a worker thread.
    Parse and validate, build the core's Turn, render its events (openai_chat)."""
    # Everything sized by the client (the JSON parse and validation, then the core's
    # tools, grammar, template and tokenizer) runs off the event loop, in the prepare
    # pool, within one deadline.
    deadline = turn_deadline()
    chat = await off_loop(deadline, lambda: validated_chat_request(request.body))
    call.stream = chat.is_stream
    started = await start_turn(
        request,
        openai_chat.turn_of(chat, openai_chat.completion_id()),
        model=chat.validated_data.get("model"),
        session_id=chat.session_key(request.headers.get("X-Session-Id")),
        deadline=deadline,
    )
    completion = openai_chat.Completion.of(chat, started)
    if call.stream:
        first = await first_event(started.events)
        return openai_chat.stream(started.events, first, completion, chat.wants_usage)
    return await openai_chat.complete(started.events, completion)
