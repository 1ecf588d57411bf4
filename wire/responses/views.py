"""OpenAI Responses API: POST /v1/responses, GET and DELETE /v1/responses/{id}.

A thin wire format over the chat core: the request is checked (wire.responses.request),
becomes a Turn, runs through pantheon_platform.chat_http.start_turn, and the core's events are
rendered by one ResponseBuilder for both the JSON body and the SSE events.

Continuing: a stored response keeps its conversation (the messages that led to it and
its output) and the session id its turn ran under. A follow-up naming it in
`previous_response_id` is that conversation plus its new input, run under the same
session id, so the engine resumes from the previous turn's KV (usage reports the cached
tokens). Without a session id of its own (`prompt_cache_key`, `session_id`,
X-Session-Id), a turn runs under IMPLICIT_SESSION in the caller's namespace: one session
id holding the key's most recent conversations (the engine keeps a few per id and
matches the longest shared prefix).

A session id the server chose is implicit (engine.serving.sessions): a cache that makes
no one wait. It counts against its own key's session cap, is dropped after
PANTHEON_RESPONSES_IMPLICIT_TTL_S idle, is evicted first when an explicit session needs
its slot, and is never written to disk. When no free slot is left for it, the turn runs
without one (cached_tokens 0) rather than being refused. `store: false` without a
session id runs without a session: nothing could continue it. Deleting a response
releases the implicit session it ran under once no other stored response of the key
names that session (an explicit one is the client's to release: POST /session/release).
"""

from __future__ import annotations

import logging
import time
from collections.abc import AsyncGenerator, AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, replace

from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from engine import FinishEvent, GenerationFailed, InvalidTurn, SessionCapacity, SessionKey, Turn
from pantheon_platform import tenancy
from pantheon_platform.chat_http import StartedTurn, off_loop, start_turn, turn_deadline
from pantheon_platform.errors import (
    ApiError,
    api_error_from,
    invalid_request,
    json_response,
    method_not_allowed,
)
from pantheon_platform.runtime import get_runtime
from pantheon_platform.sse import EventStreamResponse
from pantheon_platform.strict_json import IDENTIFIER_MAX, parse_json_object
from wire.responses import storage
from wire.responses.models import StoredResponse
from wire.responses.render import ResponseBuilder, is_response_id, new_id, sse_event
from wire.responses.request import ResponsesRequest, parse_request
from wire.route import OPENAI_ERRORS, RouteCall, first_event, post_route

log = logging.getLogger("pantheon.http")

IMPLICIT_SESSION = "pantheon-responses"
# The chat core names Turn fields; the client sent these.
_PARAMS = {"messages": "input", "response_format": "text.format"}


# --- POST /v1/responses ----------------------------------------------------------------


@post_route(OPENAI_ERRORS, "response failed")
async def create_response(request: HttpRequest, call: RouteCall) -> HttpResponse:
    deadline = turn_deadline()
    req = await off_loop(deadline, lambda: parse_request(parse_json_object(request.body)))
    call.stream = req.stream
    namespace = tenancy.namespace(request)
    previous = None
    if req.previous_response_id:
        previous = await stored_response(
            namespace, req.previous_response_id, "previous_response_id"
        )
    conversation = [*(previous.conversation if previous else ()), *req.input_messages]
    if not conversation:
        raise invalid_request("input: expected at least one item", param="input")
    messages = [{"role": "system", "content": req.instructions}] if req.instructions else []
    messages += conversation
    session_id, implicit = _session(request, req, previous)
    response_id = new_id("resp")
    turn = Turn(
        messages=tuple(messages),
        session_implicit=implicit,
        tools=req.tools,
        tool_choice=req.tool_choice,
        response_format=req.response_format,
        enable_thinking=req.enable_thinking,
        reasoning_budget=req.reasoning_budget,
        reasoning_effort=req.reasoning_echo.get("effort"),
        sampling=req.sampling(),
        logprobs=req.top_logprobs > 0,
        request_id=response_id,
        speculation=req.speculation,
        truncation=req.truncation,
    )
    model = req.model or (previous.model_name if previous else None)
    try:
        started = await start_turn(
            request, turn, model=model, session_id=session_id, deadline=deadline
        )
    except InvalidTurn as exc:
        raise invalid_request(exc.message, _PARAMS.get(exc.param, exc.param)) from None
    started, first = await _first_event(started, implicit)
    saved_session = session_id if started.session_id is not None else None
    turn_state = _TurnState(
        request=req,
        namespace=namespace,
        model=started.model,
        session_id=saved_session,
        conversation=conversation,
    )
    builder = ResponseBuilder(
        _base_response(response_id, started.model, req), logprobs=req.top_logprobs > 0
    )
    if call.stream:
        return EventStreamResponse(_sse(started.events, first, builder, turn_state))
    return await _complete(started.events, first, builder, turn_state)


def _session(request, req: ResponsesRequest, previous) -> tuple[str | None, bool]:
    """(the session id the turn runs under, None for none; whether the server chose it:
    an implicit session, which runs without one when no session slot is free): the
    client's own (prompt_cache_key, session_id, the X-Session-Id header) is kept to as
    the chat route does; else none for a response not stored (nothing can continue it);
    else the previous response's, else IMPLICIT_SESSION."""
    explicit = req.session_id or request.headers.get("X-Session-Id")
    if explicit:
        if len(explicit) > IDENTIFIER_MAX:
            raise invalid_request(f"X-Session-Id: at most {IDENTIFIER_MAX} characters")
        return explicit, False
    if not req.store:
        return None, False
    if previous is not None and previous.session_id:
        return previous.session_id, True
    return IMPLICIT_SESSION, True


async def _first_event(started: StartedTurn, implicit: bool):
    """Start the generation (its refusals raised here, before any byte is sent). An
    implicit session (an id the server chose) that finds no free session slot is dropped:
    the turn runs uncached instead of being refused."""
    try:
        return started, await first_event(started.events)
    except SessionCapacity:
        if not implicit:
            raise
    prepared = replace(
        started.prepared,
        request=replace(started.prepared.request, session_id=None, session_implicit=False),
        turn=replace(started.prepared.turn, session_id=None, session_implicit=False),
    )
    started = started.rerun(prepared)
    return started, await first_event(started.events)


@dataclass(frozen=True)
class _TurnState:
    """What storing a finished response needs."""

    request: ResponsesRequest
    namespace: str
    model: str
    session_id: str | None  # None: the turn ran without a session
    conversation: list[dict]  # the messages before its output, instructions excluded


def _base_response(response_id: str, model: str, req: ResponsesRequest) -> dict:
    """The response object as it starts (status in_progress, no output yet)."""
    body = {
        "id": response_id,
        "object": "response",
        "created_at": int(time.time()),
        "status": "in_progress",
        "background": False,
        "error": None,
        "incomplete_details": None,
        "instructions": req.instructions,
        "max_output_tokens": req.max_output_tokens,
        "model": model,
        "output": [],
        "parallel_tool_calls": req.parallel_tool_calls,
        "previous_response_id": req.previous_response_id,
        "reasoning": req.reasoning_echo,
        "store": req.store,
        "temperature": req.temperature,
        "text": req.text_echo,
        "tool_choice": req.tool_choice_echo,
        "tools": list(req.tools_echo),
        "top_logprobs": req.top_logprobs,
        "top_p": req.top_p,
        "truncation": req.truncation,
        "usage": None,
        "metadata": req.metadata,
    }
    if req.session_id:
        body["prompt_cache_key"] = req.session_id
    return body


async def _complete(
    events: AsyncIterator, first, builder: ResponseBuilder, state: _TurnState
) -> HttpResponse:
    builder.opening()
    finished = False
    async with aclosing(events):
        event = first
        while event is not None:
            if isinstance(event, FinishEvent):
                builder.finish(event)
                finished = True
            else:
                builder.push(event)
            event = await anext(events, None)
    if not finished:
        raise GenerationFailed("the engine stream ended without a finish event")
    await _store(builder.response, state)
    return json_response(builder.response)


async def _sse(
    events: AsyncIterator, first, builder: ResponseBuilder, state: _TurnState
) -> AsyncGenerator[bytes, None]:
    for event in builder.opening():
        yield sse_event(event)
    finished = False
    try:
        event = first
        while event is not None:
            steps = builder.finish(event) if isinstance(event, FinishEvent) else builder.push(event)
            finished = finished or isinstance(event, FinishEvent)
            for step in steps:
                yield sse_event(step)
            event = await anext(events, None)
        if not finished:
            raise GenerationFailed("the engine stream ended without a finish event")
        # Stored before the last event leaves: a response the client saw complete can be
        # continued and retrieved.
        await _store(builder.response, state)
    except Exception as exc:
        # The status line is gone: an `error` event, then response.failed, end the stream.
        error = api_error_from(exc, stream=True)
        if error.status == 500:
            log.error(
                "response %s failed after the stream opened", builder.response["id"], exc_info=exc
            )
        yield sse_event(
            builder.event(
                "error",
                code=error.type,
                message=error.message,
                param=error.extra.get("param"),
            )
        )
        builder.response["status"] = "failed"
        builder.response["error"] = {"code": "server_error", "message": error.message}
        yield sse_event(builder.event("response.failed", response=builder.snapshot()))
        return
    finally:
        # Normal end, failure, or the client gone (the handler closes this generator):
        # the engine stops generating.
        await events.aclose()
    yield sse_event(builder.closing())


# --- storage -----------------------------------------------------------------------------


def _output_message(output: list[dict]) -> dict:
    """The response's output as the assistant turn a follow-up's conversation holds.
    Calls cut short (status incomplete) are left out: their arguments are not JSON."""
    text, reasoning, calls = [], [], []
    for item in output:
        if item["type"] == "message":
            text += [part.get("text", "") for part in item["content"]]
        elif item["type"] == "reasoning":
            reasoning += [part.get("text", "") for part in item.get("content") or ()]
        elif item["type"] == "function_call" and item["status"] == "completed":
            calls.append(
                {
                    "id": item["call_id"],
                    "type": "function",
                    "function": {"name": item["name"], "arguments": item["arguments"]},
                }
            )
    message: dict = {"role": "assistant", "content": "".join(text)}
    if reasoning:
        message["reasoning_content"] = "".join(reasoning)
    if calls:
        message["tool_calls"] = calls
    return message


async def _store(body: dict, state: _TurnState) -> None:
    """Store the response when asked to; one whose record is over the item cap is
    answered, not stored, and says so (`store: false`)."""
    if not state.request.store:
        return
    conversation = [*state.conversation, _output_message(body["output"])]
    args = (body, state.namespace, state.model, state.session_id, conversation)
    if not await storage.db(storage.save, *args):
        body["store"] = False


def _release_implicit(namespace: str, deleted: storage.Deleted) -> None:
    """The implicit session the deleted response ran under is released once no stored
    response of the key names it (an explicit session is left alone: the client's)."""
    if not deleted.last:
        return
    svc = get_runtime().services().get(deleted.model)
    if svc is not None and svc.sessions.enabled:
        svc.sessions.release_implicit(SessionKey(deleted.session_id, namespace))


def _not_found(response_id: str, param: str | None = None) -> ApiError:
    extra = {"param": param} if param else None
    return ApiError(
        404, f"Response with id '{response_id}' not found.", "invalid_request_error", extra=extra
    )


async def stored_response(
    namespace: str, response_id: str, param: str | None = None
) -> StoredResponse:
    """The caller's stored response `response_id`, or 404: another key's is not found
    (nor is an id this server never makes, without asking the database)."""
    if not is_response_id(response_id):
        raise _not_found(response_id, param)
    stored = await storage.db(storage.find, namespace, response_id)
    if stored is None:
        raise _not_found(response_id, param)
    return stored


# --- GET / DELETE /v1/responses/{id} -------------------------------------------------------


@csrf_exempt
async def response_detail(request: HttpRequest, response_id: str) -> HttpResponse:
    """GET: the stored response object. DELETE: forget it."""
    if request.method not in ("GET", "DELETE"):
        return method_not_allowed(request.method or "", ["GET", "DELETE", "OPTIONS"]).response()
    try:
        namespace = tenancy.namespace(request)
        if request.method == "GET":
            return json_response((await stored_response(namespace, response_id)).body)
        deleted = (
            await storage.db(storage.delete, namespace, response_id)
            if is_response_id(response_id)
            else None
        )
        if deleted is None:
            raise _not_found(response_id)
        _release_implicit(namespace, deleted)
        return json_response({"id": response_id, "object": "response.deleted", "deleted": True})
    except Exception as exc:
        error = api_error_from(exc)
        if error.status == 500:
            log.error("responses/%s failed", request.method, exc_info=exc)
        return error.response()
