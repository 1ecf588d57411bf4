"""Client routes: GET /, POST /v1/chat/completions (GET /v1/models: meta_views).

Views validate, call the runtime/engine, render. No tensor or tokenizer code here, and no
generation logic: a chat request becomes the chat core's Turn (engine.chat),
started through pantheon_platform.chat_http and rendered by wire.openai_chat.render.
"""

from __future__ import annotations

import logging

from django.conf import settings
from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt
from rest_framework.response import Response
from rest_framework.views import APIView

import kernels
from pantheon_platform.chat_http import off_loop, start_turn, turn_deadline
from pantheon_platform.errors import (
    api_error_from,
    invalid_request,
    json_response,
    method_not_allowed,
    not_found,
)
from pantheon_platform.runtime import FAILED, build_id, get_runtime
from pantheon_platform.strict_json import parse_json_object
from wire.openai_chat import render as openai_chat
from wire.openai_chat.request import validated_chat_request
from wire.route import OPENAI_ERRORS, RouteCall, first_event, generating_route

log = logging.getLogger("pantheon.http")


def _backend_setting() -> str:
    return getattr(settings, "PANTHEON_ENGINE_OPTIONS", {}).get("backend", "auto")


class HealthView(APIView):
    """GET /: always 200; says what this process runs on and what is (still) loading."""

    def get(self, request):
        services = get_runtime().services()
        states = get_runtime().states()
        body = {
            "service": "pantheon",
            "status": "ok",
            "backend": kernels.backend_name(),
            # The compiled CPU kernels, or "numpy" when they could not be built: said, not
            # silent (each model's row says what it loaded with).
            "kernel": kernels.kernel_name(_backend_setting()),
            "build": build_id(),
            "accelerator": any(svc.on_accelerator for svc in services.values()),
            "dies_visible": kernels.dies_visible(),
            "models": {name: s.state for name, s in states.items()},
        }
        isa = kernels.kernel_isa(_backend_setting())
        if isa:
            body["kernel_isa"] = isa
        activations = kernels.kernel_activations(_backend_setting())
        if activations:
            body["kernel_activations"] = activations
        load_errors = {name: s.error for name, s in states.items() if s.state == FAILED}
        if load_errors:
            body["load_errors"] = load_errors
        progress = {i.name: i.progress.as_dict() for i in get_runtime().loading() if i.progress}
        if progress:  # while a load runs: how far it has got
            body["progress"] = progress
        return Response(body)


# --- POST /v1/chat/completions ------------------------------------------------------


@generating_route(OPENAI_ERRORS, "chat completion failed")
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


# --- POST /admin/debug/simulate-memory-pressure --------------------------------------

PRESSURE_LEVELS = {name: i for i, name in enumerate(("normal", "elevated", "high", "critical"))}


@csrf_exempt
def simulate_memory_pressure(request: HttpRequest) -> HttpResponse:
    """Operator test hook (PANTHEON_DEBUG_ROUTES=1, else the JSON 404): pin a model's
    memory-pressure ladder at a level, or `null` to follow real free memory again.

    Body: {"model": name (optional with one model), "level": "normal" | "elevated" |
    "high" | "critical" | 0..3 | null}. Answers the served numbers after the move.
    """
    if not getattr(settings, "PANTHEON_DEBUG_ROUTES", False):
        return not_found(request)
    if request.method != "POST":
        return method_not_allowed(request.method or "", ["POST", "OPTIONS"]).response()
    try:
        body = parse_json_object(request.body)
        level = body.get("level")
        if isinstance(level, str) and level in PRESSURE_LEVELS:
            level = PRESSURE_LEVELS[level]
        if level is not None and (
            isinstance(level, bool) or not isinstance(level, int) or level not in range(4)
        ):
            raise invalid_request(
                "level: expected one of normal, elevated, high, critical, 0..3 or null"
            )
        model = body.get("model")
        if model is not None and not isinstance(model, str):
            raise invalid_request("model: expected a string")
        name, svc = get_runtime().resolve(model)
        svc.simulate_memory_pressure(level)
    except Exception as exc:
        error = api_error_from(exc)
        if error.status == 500:
            log.error("simulate-memory-pressure failed", exc_info=exc)
        return error.response()
    return json_response(
        {
            "model": name,
            "memory_pressure": svc.memory_pressure,
            "simulated": level is not None,
            "max_concurrent": svc.max_concurrent,
            "max_concurrent_configured": svc.max_concurrent_configured,
            "context_window": svc.context_window,
            "context_window_configured": svc.context_window_configured,
        }
    )
