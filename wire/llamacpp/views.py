"""llama-server's routes (llama.cpp's tools and editor plugins call them): GET /props,
GET /slots, POST /completion and POST /infill.

A generation is a Turn with a raw prompt (no chat template: the text as written, BOS
where the GGUF adds one; /infill's fill-in-the-middle prompt as token ids) on the chat
core, as /v1/completions runs. Errors have the contract's shape (llama-server's is the
same `{"error": {"message", "type", "code"}}` but for the code's value). A model is
chosen by the body's (or the query's) `model`, as llama-server's router mode does; with
one served, any name reaches it.
"""

from __future__ import annotations

import json
import logging

from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from engine import Turn
from pantheon_platform.chat_http import off_loop, start_turn, turn_deadline
from pantheon_platform.errors import ApiError, api_error_from, json_response, method_not_allowed
from pantheon_platform.runtime import get_runtime
from pantheon_platform.sse import EventStreamResponse
from pantheon_platform.strict_json import parse_json_object
from pantheon_platform.tenancy import is_operator
from wire.llamacpp import render
from wire.llamacpp.request import GenerateRequest, parse_completion, parse_infill
from wire.route import OPENAI_ERRORS, RouteCall, first_event, post_route

log = logging.getLogger("pantheon.http")


def _get(request: HttpRequest, answer) -> HttpResponse:
    """A GET route: 405 for another method; the answer of `answer(name, svc)` for the
    model the query names (`?model=`), any error in the contract's shape."""
    if request.method != "GET":
        return method_not_allowed(request.method or "", ["GET", "OPTIONS"]).response()
    try:
        name, svc = get_runtime().resolve(request.GET.get("model") or None)
        return answer(name, svc)
    except Exception as exc:
        error = api_error_from(exc)
        if error.status == 500:
            log.error("%s failed", request.path, exc_info=exc)
        return error.response()


@csrf_exempt
def props(request: HttpRequest) -> HttpResponse:
    """GET /props: the served model's default settings, slots, chat template."""
    full_path = is_operator(request)
    return _get(request, lambda name, svc: json_response(render.props_json(name, svc, full_path)))


@csrf_exempt
def slots(request: HttpRequest) -> HttpResponse:
    """GET /slots: each slot's state; `?fail_on_no_slot=1`: 503 when none is free."""

    def answer(name, svc):
        listed = render.slots_json(svc)
        if request.GET.get("fail_on_no_slot") in ("1", "true") and all(
            slot["is_processing"] for slot in listed
        ):
            raise ApiError(503, "no slot available", "unavailable_error")
        return HttpResponse(
            json.dumps(listed, separators=(",", ":")), content_type="application/json"
        )

    return _get(request, answer)


@post_route(OPENAI_ERRORS, "llama.cpp completion failed")
async def completion(request: HttpRequest, call: RouteCall) -> HttpResponse:
    deadline = turn_deadline()
    req = await off_loop(deadline, lambda: parse_completion(parse_json_object(request.body)))
    return await _generate(request, call, req, deadline)


@post_route(OPENAI_ERRORS, "llama.cpp infill failed")
async def infill(request: HttpRequest, call: RouteCall) -> HttpResponse:
    """The fill-in-the-middle prompt from the model's FIM tokens (400 without them)."""
    deadline = turn_deadline()
    data = await off_loop(deadline, lambda: parse_json_object(request.body))
    _, svc = get_runtime().resolve(
        data.get("model") if isinstance(data.get("model"), str) else None
    )
    req = await off_loop(
        deadline,
        lambda: parse_infill(data, svc.gguf.metadata, svc.tokenizer, svc.context_window_configured),
    )
    return await _generate(request, call, req, deadline)


async def _generate(request, call: RouteCall, req: GenerateRequest, deadline) -> HttpResponse:
    call.stream = req.stream
    turn = Turn(messages=(), raw_prompt=req.prompt, sampling=req.sampling())
    started = await start_turn(request, turn, model=req.model, session_id=None, deadline=deadline)
    generation = render.Generation(started, req)
    first = await first_event(started.events)
    if req.stream:
        return EventStreamResponse(render.stream(started.events, first, generation))
    return json_response(await render.complete(started.events, first, generation))
