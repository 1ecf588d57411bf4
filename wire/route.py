"""The skeleton every wire format's model routes share (generate, embed, tokenize).

Such a route answers POST only, refuses while the server drains, and turns any exception
into its format's error (OpenAI's, Anthropic's or Ollama's shape), logging a 500's
traceback (never in the body): `post_route` does that around the format's own view.
Before a stream opens, the view awaits the engine's first event (`first_event`):
refusals the engine knows up front (context, busy, memory) still get their status line
and the format's error body.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from functools import wraps

from django.http import HttpRequest, HttpResponse
from django.views.decorators.csrf import csrf_exempt

from engine import GenerationFailed
from pantheon_platform import shutdown
from pantheon_platform.errors import ApiError, api_error_from, method_not_allowed, shutting_down

log = logging.getLogger("pantheon.http")


@dataclass(frozen=True)
class ErrorShape:
    """How a wire format answers an error: `error_of(exc, stream)` is the exception as an
    ApiError (`stream`: the request asked for a stream, which shapes a
    context_over_budget), `respond(error)` its response."""

    error_of: Callable[[Exception, bool], ApiError]
    respond: Callable[[ApiError], HttpResponse]


# OpenAI's shape: {"error": {"message", "type", "code", ...}}.
OPENAI_ERRORS = ErrorShape(
    error_of=lambda exc, stream: api_error_from(exc, stream=stream),
    respond=lambda error: error.response(),
)


@dataclass
class RouteCall:
    """What the route's error depends on, set by the view as it learns it."""

    stream: bool = False


def post_route(errors: ErrorShape, failure: str, *, drain: bool = True):
    """Decorate `view(request, call, *args)` as a POST route: 405 for another method,
    503 while draining (unless `drain` is False), and any exception it raises answered
    in `errors`' shape (a 500 logged as `failure`, with its traceback)."""

    def decorate(
        view: Callable[..., Awaitable[HttpResponse]],
    ) -> Callable[..., Awaitable[HttpResponse]]:
        @csrf_exempt
        @wraps(view)
        async def route(request: HttpRequest, *args, **kwargs) -> HttpResponse:
            if request.method != "POST":
                allowed = ["POST", "OPTIONS"]
                return errors.respond(method_not_allowed(request.method or "", allowed))
            if drain and shutdown.draining():
                return errors.respond(shutting_down())
            call = RouteCall()
            try:
                return await view(request, call, *args, **kwargs)
            except Exception as exc:
                error = errors.error_of(exc, call.stream)
                if error.status == 500:
                    log.error(failure, exc_info=exc)  # the traceback in the log, not the body
                return errors.respond(error)

        return route

    return decorate


async def first_event(events: AsyncIterator):
    """Start the generation: its first event, before any byte of a stream is sent. The
    events are closed if it raises (the engine's refusal, for the route to shape) or if
    the stream ended without one (GenerationFailed)."""
    try:
        first = await anext(events, None)
    except BaseException:
        await events.aclose()
        raise
    if first is None:
        await events.aclose()
        raise GenerationFailed("the engine stream ended without a finish event")
    return first


def api_route(methods: tuple[str, ...], failure: str):
    """Decorate an async `view(request, *args)` of a resource route (files, batches):
    405 for a method not in `methods`, any exception answered in OpenAI's error shape (a
    500 logged as `failure`, with its traceback)."""

    def decorate(
        view: Callable[..., Awaitable[HttpResponse]],
    ) -> Callable[..., Awaitable[HttpResponse]]:
        @csrf_exempt
        @wraps(view)
        async def route(request: HttpRequest, *args, **kwargs) -> HttpResponse:
            if request.method not in methods:
                allowed = [*methods, "OPTIONS"]
                return OPENAI_ERRORS.respond(method_not_allowed(request.method or "", allowed))
            try:
                return await view(request, *args, **kwargs)
            except Exception as exc:
                error = OPENAI_ERRORS.error_of(exc, False)
                if error.status == 500:
                    log.error(failure, exc_info=exc)
                return OPENAI_ERRORS.respond(error)

        return route

    return decorate
