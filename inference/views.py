"""Client routes: GET /, GET /v1/models, POST /v1/chat/completions.

Views validate, call the runtime/engine, render. No tensor or tokenizer code here.
"""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import AsyncGenerator
from contextlib import aclosing
from dataclasses import dataclass

from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from rest_framework.response import Response
from rest_framework.views import APIView

import kernels
from inference.engine.chat_template import ChatTemplateError
from inference.engine.types import (
    ContextOverBudget,
    FinishEvent,
    GenerationFailed,
    GenerationRequest,
    TokenEvent,
    Usage,
)
from inference.errors import api_error_from, invalid_request, json_response, method_not_allowed
from inference.runtime import FAILED, build_id, runtime
from inference.serializers import validated_chat_request
from inference.sse import DONE, EventStreamResponse, sse_data

log = logging.getLogger("pantheon.http")


class HealthView(APIView):
    """GET /: always 200; says what this process runs on and what is (still) loading."""

    def get(self, request):
        services = runtime.services()
        states = runtime.states()
        body = {
            "service": "pantheon",
            "status": "ok",
            "backend": kernels.backend_name(),
            "build": build_id(),
            "accelerator": any(svc.on_accelerator for svc in services.values()),
            "dies_visible": kernels.dies_visible(),
            "models": {name: s.state for name, s in states.items()},
        }
        load_errors = {name: s.error for name, s in states.items() if s.state == FAILED}
        if load_errors:
            body["load_errors"] = load_errors
        return Response(body)


class ModelsView(APIView):
    """GET /v1/models: one row per served name, loaded models only."""

    def get(self, request):
        data = []
        for name, svc in sorted(runtime.services().items()):
            row = {
                "id": name,
                "object": "model",
                "created": svc.created,
                "owned_by": "pantheon",
                "max_sessions": svc.max_sessions,
                "max_concurrent": svc.max_concurrent,
            }
            if svc.context_window:  # omitted when unknown, never 0 (the contract)
                row["context_window"] = svc.context_window
            data.append(row)
        return Response(
            {"object": "list", "backend": kernels.backend_name(), "build": build_id(), "data": data}
        )


# --- POST /v1/chat/completions ------------------------------------------------------


@csrf_exempt
async def chat_completions(request: HttpRequest) -> HttpResponse:
    """Async, so that a generation waits on the engine without holding a worker thread."""
    if request.method != "POST":
        return method_not_allowed(request.method or "", ["POST", "OPTIONS"]).response()
    stream = False
    try:
        chat = validated_chat_request(request.body)
        stream = chat.is_stream
        name, svc = runtime.resolve(chat.validated_data.get("model"))
        # On the event loop: rendering and tokenizing take milliseconds; the forward
        # passes run on the engine's own thread.
        try:
            prompt_ids = svc.encode_chat(chat.validated_data["messages"])
        except ChatTemplateError as exc:  # the template refused this conversation
            raise invalid_request(f"cannot render the chat template: {exc}") from None
        completion = _Completion(
            id=f"chatcmpl-{secrets.token_hex(12)}", created=int(time.time()), model=name
        )
        gen_request = GenerationRequest(
            request_id=completion.id,
            prompt_ids=tuple(prompt_ids),
            params=chat.sampling_params(),
        )
        if stream:
            return await _stream(svc.generate(gen_request), completion, chat.wants_usage)
        return await _complete(svc.generate(gen_request), completion)
    except Exception as exc:
        error = api_error_from(exc, stream=stream)
        if error.status == 500:
            # The traceback goes to the log, never into the body.
            log.error("chat completion failed", exc_info=exc)
        return error.response()


@dataclass(frozen=True)
class _Completion:
    id: str
    created: int
    model: str

    def chunk(self, delta: dict, finish_reason: str | None = None) -> bytes:
        return sse_data(
            {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
            }
        )

    def usage_chunk(self, usage: Usage) -> bytes:
        return sse_data(
            {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [],
                "usage": usage_json(usage),
            }
        )


def usage_json(usage: Usage) -> dict:
    return {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        "kv_used": usage.kv_used,
        "kv_cap": usage.kv_cap,
    }


async def _complete(events: AsyncGenerator, completion: _Completion) -> JsonResponse:
    parts: list[str] = []
    finish: FinishEvent | None = None
    # aclosing: if this view is cancelled (client gone), the engine stream is closed
    # and the generation stops.
    async with aclosing(events):
        async for event in events:
            if isinstance(event, FinishEvent):
                finish = event
                break
            parts.append(event.text)
    if finish is None:
        raise GenerationFailed("the engine stream ended without a finish event")
    return json_response(
        {
            "id": completion.id,
            "object": "chat.completion",
            "created": completion.created,
            "model": completion.model,
            "choices": [
                {
                    "index": 0,
                    "message": {"role": "assistant", "content": "".join(parts)},
                    "finish_reason": finish.finish_reason,
                }
            ],
            "usage": usage_json(finish.usage),
        }
    )


async def _stream(
    events: AsyncGenerator, completion: _Completion, include_usage: bool
) -> HttpResponse:
    # Wait for the first event before answering: refusals the engine can know up front
    # (context_over_budget, server_busy) then still get their real status code.
    try:
        first = await anext(events, None)
    except BaseException:
        await events.aclose()
        raise
    if first is None:
        raise GenerationFailed("the engine stream ended without a finish event")
    return EventStreamResponse(_sse_events(events, first, completion, include_usage))


async def _sse_events(
    events: AsyncGenerator,
    first: TokenEvent | FinishEvent,
    completion: _Completion,
    include_usage: bool,
) -> AsyncGenerator[bytes, None]:
    finish: FinishEvent | None = None
    try:
        yield completion.chunk({"role": "assistant"})
        event: TokenEvent | FinishEvent | None = first
        while isinstance(event, TokenEvent):
            if event.text:
                yield completion.chunk({"content": event.text})
            event = await anext(events, None)
        finish = event
        if finish is None:
            log.error("generation %s: engine stream ended without a finish event", completion.id)
    except ContextOverBudget as exc:
        # The status line is gone; the contract's terminal error event ends the stream.
        yield sse_data(api_error_from(exc, stream=True).body())
        return
    except Exception:
        # Other failures close the choice normally (the contract); the log has the why.
        log.exception("generation %s failed after the stream opened", completion.id)
    finally:
        # Runs on normal end, on failure, and when the client disconnects (the handler
        # closes or cancels this generator): the engine stops generating.
        await events.aclose()
    yield completion.chunk({}, finish.finish_reason if finish else "stop")
    if include_usage and finish is not None:
        yield completion.usage_chunk(finish.usage)
    yield DONE
