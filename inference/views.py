"""Client routes: GET /, GET /v1/models, POST /v1/chat/completions.

Views validate, call the runtime/engine, render. No tensor or tokenizer code here.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import secrets
import threading
import time
from collections.abc import AsyncGenerator, Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import aclosing
from dataclasses import dataclass
from typing import TypeVar

from django.conf import settings
from django.http import HttpRequest, HttpResponse, JsonResponse
from django.views.decorators.csrf import csrf_exempt
from rest_framework.response import Response
from rest_framework.views import APIView

import kernels
from inference import shutdown
from inference.engine.decoding.constraints import plan_response_format
from inference.engine.text.chat_template import ChatTemplateError
from inference.engine.text.tokenizer import TooManyTokens
from inference.engine.tools.dialects import CallOpened, parse_tools
from inference.engine.tools.prompt import call_plan
from inference.engine.types import (
    ContextOverBudget,
    FinishEvent,
    GenerationFailed,
    GenerationRequest,
    TokenEvent,
    Usage,
)
from inference.errors import (
    ApiError,
    api_error_from,
    invalid_request,
    json_response,
    method_not_allowed,
    not_found,
    shutting_down,
)
from inference.request_log import note
from inference.runtime import FAILED, build_id, runtime
from inference.serializers import parse_json_object, validated_chat_request
from inference.sse import DONE, EventStreamResponse, sse_data
from sessions import tenancy

log = logging.getLogger("pantheon.http")
T = TypeVar("T")


def _backend_setting() -> str:
    return getattr(settings, "PANTHEON_ENGINE_OPTIONS", {}).get("backend", "auto")


class HealthView(APIView):
    """GET /: always 200; says what this process runs on and what is (still) loading."""

    def get(self, request):
        services = runtime.services()
        states = runtime.states()
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
            # A "required" tool call is compelled after an unconstrained think block
            # (every dialect has a grammar; none when PANTHEON_TOOL_GRAMMAR=0).
            row["tool_choice_required_with_thinking"] = svc.think_style and (
                getattr(settings, "PANTHEON_TOOL_GRAMMAR", None) is not False
            )
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
    if shutdown.draining():
        return shutting_down().response()
    stream = False
    try:
        # Everything sized by the client (the JSON parse and validation, the tools, the
        # response_format grammar, the chat template, the tokenizer) runs off the event
        # loop, in the prepare pool, within PREPARE_TIMEOUT_S.
        deadline = time.monotonic() + PREPARE_TIMEOUT_S
        chat = await off_loop(deadline, lambda: validated_chat_request(request.body))
        stream = chat.is_stream
        name, svc = runtime.resolve(chat.validated_data.get("model"))
        # In the caller's key's namespace: another key's session of that id is not reached.
        session_id = tenancy.session_key(
            request, chat.session_key(request.headers.get("X-Session-Id"))
        )
        note(request, model=name, session_id=session_id)
        data = chat.validated_data
        enable_thinking = data.get("enable_thinking")
        if enable_thinking is None:
            enable_thinking = not getattr(settings, "PANTHEON_NO_THINK", False)
        tools, prompt_ids, think_open, plan, format_status = await off_loop(
            deadline, lambda: _prepare(chat, svc, enable_thinking)
        )
        budget = chat.requested_reasoning_budget()
        if budget is None:
            budget = svc.config.reasoning_budget
        completion = _Completion(
            id=f"chatcmpl-{secrets.token_hex(12)}",
            created=int(time.time()),
            model=name,
            n_requested=chat.n_requested,
            n=chat.n_choices,
            logprobs=chat.wants_logprobs,
            format_message=getattr(plan, "message", "")
            if format_status == "schema_downgraded"
            else "",
        )
        gen_request = GenerationRequest(
            request_id=completion.id,
            prompt_ids=tuple(prompt_ids),
            params=chat.sampling_params(),
            n=chat.n_choices,
            session_id=session_id,
            think_style=svc.think_style,
            think_open=think_open,
            reasoning_budget=max(0, budget),
            constraint=plan,
            format_status=format_status,
            tool_dialect=tools.dialect,
            tools=tuple(tools.specs),
            tool_compelled=tools.compelled,
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


# --- off the event loop --------------------------------------------------------------

# A request's preparation (parse, validate, render, tokenize) must end within this; past
# it the client gets 413 request_too_large (or 429 server_busy if it never got a worker).
PREPARE_TIMEOUT_S = 10.0
PREPARE_WORKERS = 4
_prepare_pool = ThreadPoolExecutor(
    max_workers=PREPARE_WORKERS, thread_name_prefix="pantheon-prepare"
)


async def off_loop(deadline: float, work: Callable[[], T]) -> T:
    """`work()` on the prepare pool, awaited until `deadline` (time.monotonic()). The
    pool is bounded: a flood of large requests queues there, never on the event loop. A
    job still queued when its request gives up never starts; one already running cannot
    be stopped, but ends on its own (every step of it is bounded by a limit)."""
    started = threading.Event()

    def run() -> T:
        started.set()
        return work()

    future = _prepare_pool.submit(run)
    try:
        return await asyncio.wait_for(
            asyncio.wrap_future(future), max(0.0, deadline - time.monotonic())
        )
    except TimeoutError:
        future.cancel()
        if not started.is_set():
            raise ApiError(
                429,
                f"the server is busy preparing other requests (none started within "
                f"{PREPARE_TIMEOUT_S:g} s); retry later",
                "server_busy",
                headers={"Retry-After": str(math.ceil(PREPARE_TIMEOUT_S))},
            ) from None
        raise ApiError(
            413,
            f"preparing this request (parsing, the chat template, tokenizing) took longer "
            f"than {PREPARE_TIMEOUT_S:g} s; send a smaller one",
            "request_too_large",
        ) from None


def _prepare(chat, svc, enable_thinking: bool) -> tuple:
    """(tools, prompt ids, think_open, constraint plan, response_format status): the
    request's CPU work before the engine, on the prepare pool."""
    tools = _tools(chat, svc.tool_dialect)
    try:
        prompt_ids, think_open = svc.prepare_chat(
            chat.validated_data["messages"], enable_thinking, tools.specs, tools.dialect
        )
    except ChatTemplateError as exc:  # the template refused this conversation
        raise invalid_request(f"cannot render the chat template: {exc}") from None
    except TooManyTokens as exc:  # refused before tokenizing: certain not to fit
        # As a ContextOverBudget (api_error_from): a stream's error carries the numbers.
        extra = {"kv_used": exc.at_least, "kv_cap": exc.limit} if chat.is_stream else None
        raise ApiError(
            422,
            f"prompt is at least {exc.at_least} tokens but the context window is "
            f"{exc.limit} tokens; shorten the conversation and retry",
            "context_over_budget",
            extra=extra,
        ) from None
    except ValueError as exc:  # a malformed tool call in the history
        raise invalid_request(str(exc)) from None
    plan, format_status = _response_format(chat)
    if tools.plan is not None:
        plan = tools.plan
    return tools, prompt_ids, think_open, plan, format_status


@dataclass(frozen=True)
class _Tools:
    dialect: object = None  # None: no tools offered (or tool_choice "none")
    specs: tuple = ()
    plan: object = None  # the grammar compelling a call, when one is armed
    compelled: bool = False  # tool_choice "required" or a named function


def _tools(chat, dialect) -> _Tools:
    """The request's tools: the dialect the model writes, the parsed specs, and the
    grammar PANTHEON_TOOL_GRAMMAR arms for this tool_choice (unset: "required" only;
    1: also a named function; 0: none)."""
    data = chat.validated_data
    if not chat.tools_active:
        return _Tools()
    try:
        specs = parse_tools(data["tools"])
    except ValueError as exc:
        raise invalid_request(f"tools: {exc}") from None
    choice = data.get("tool_choice") or "auto"
    setting = getattr(settings, "PANTHEON_TOOL_GRAMMAR", None)
    only = None
    if isinstance(choice, dict):
        function = choice.get("function") if choice.get("type") == "function" else None
        only = function.get("name") if isinstance(function, dict) else None
        if not isinstance(only, str) or only not in {t.name for t in specs}:
            raise invalid_request("tool_choice: expected a function named in `tools`")
    elif choice not in ("auto", "required", "none"):
        raise invalid_request('tool_choice: expected "auto", "none", "required" or a function')
    compel = (choice == "required" and setting is not False) or (only and setting is True)
    masked_auto = choice == "auto" and setting is True
    plan = None
    if compel or masked_auto:
        try:
            plan = call_plan(dialect, data["tools"], only, optional=masked_auto)
        except ValueError as exc:
            raise invalid_request(f"tools: {exc}") from None
    return _Tools(dialect, tuple(specs), plan, compelled=choice == "required" or bool(only))


def _response_format(chat) -> tuple[object, str | None]:
    """(the compiled constraint plan or None, the response_format_status to report or None
    when the request sent no response_format). Tools win over response_format."""
    response_format = chat.validated_data.get("response_format")
    if response_format is None:
        return None, None
    if chat.tools_active:
        return None, "ignored_tools_present"
    try:
        plan = plan_response_format(response_format)
    except ValueError as exc:
        raise invalid_request(f"response_format: {exc}") from None
    status = "applied" if plan.status == "text" else plan.status
    return (plan if plan.grammar else None), status


def _worst_status(statuses) -> str | None:
    """One response_format_status for the response: a choice that was not enforced wins."""
    statuses = [s for s in statuses if s]
    if not statuses:
        return None
    return "not_enforced" if "not_enforced" in statuses else statuses[0]


def tool_call_json(call) -> dict:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
    }


def tool_call_error_json(error) -> dict:
    body = {"code": error.code, "message": error.message}
    if error.function:
        body["function"] = error.function
    if error.parameter:
        body["parameter"] = error.parameter
    return body


def tool_call_delta_json(delta) -> dict:
    """A stream's tool-call delta: the opening (id, type, name, empty arguments) or a
    piece of the arguments."""
    if isinstance(delta, CallOpened):
        return {
            "index": delta.index,
            "id": delta.id,
            "type": "function",
            "function": {"name": delta.name, "arguments": ""},
        }
    return {"index": delta.index, "function": {"arguments": delta.text}}


def logprobs_json(entries) -> dict:
    return {
        "content": [
            {
                "token": e.token,
                "logprob": e.logprob,
                "bytes": list(e.bytes),
                "top_logprobs": [
                    {"token": t, "logprob": lp, "bytes": list(b)} for t, lp, b in e.top
                ],
            }
            for e in entries
        ]
    }


@dataclass(frozen=True)
class _Completion:
    id: str
    created: int
    model: str
    n_requested: int = 1
    n: int = 1  # choices asked of the engine (n_requested capped at 8)
    logprobs: bool = False
    format_message: str = ""  # why a schema was downgraded (names the feature)

    def n_status(self, choices: int) -> str | None:
        """Why fewer choices came back than `n` asked for (the contract's n_status)."""
        if choices < self.n:
            return "partial_slot_unavailable"
        if self.n < self.n_requested:
            return "capped_to_8"
        return None

    def chunk(
        self,
        delta: dict,
        finish_reason: str | None = None,
        index: int = 0,
        logprobs: dict | None = None,
        tool_call_error: dict | None = None,
        **top: object,
    ) -> bytes:
        choice = {"index": index, "delta": delta, "finish_reason": finish_reason}
        if logprobs is not None:
            choice["logprobs"] = logprobs
        if tool_call_error is not None:
            choice["tool_call_error"] = tool_call_error
        return sse_data(
            {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [choice],
                **top,
            }
        )

    def usage_chunk(self, usage: dict) -> bytes:
        return sse_data(
            {
                "id": self.id,
                "object": "chat.completion.chunk",
                "created": self.created,
                "model": self.model,
                "choices": [],
                "usage": usage,
            }
        )


def usage_json(usage: Usage) -> dict:
    body = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        "kv_used": usage.kv_used,
        "kv_cap": usage.kv_cap,
    }
    if usage.reasoning_tokens:
        body["completion_tokens_details"] = {"reasoning_tokens": usage.reasoning_tokens}
    if usage.session_conflict:
        body["session_conflict"] = True
    return body


def request_usage(finishes: dict[int, FinishEvent]) -> dict:
    """The whole request's usage: the prompt counted once, completions summed over the
    choices; kv_used is the first choice's (the one a session would keep)."""
    first = finishes[min(finishes)].usage
    return usage_json(
        Usage(
            prompt_tokens=first.prompt_tokens,
            completion_tokens=sum(f.usage.completion_tokens for f in finishes.values()),
            cached_tokens=first.cached_tokens,
            kv_used=first.kv_used,
            kv_cap=max(f.usage.kv_cap for f in finishes.values()),
            session_conflict=first.session_conflict,
            reasoning_tokens=sum(f.usage.reasoning_tokens for f in finishes.values()),
        )
    )


async def _complete(events: AsyncGenerator, completion: _Completion) -> JsonResponse:
    parts: dict[int, list[str]] = {}
    reasoning: dict[int, list[str]] = {}
    logprobs: dict[int, list] = {}
    finishes: dict[int, FinishEvent] = {}
    # aclosing: if this view is cancelled (client gone), the engine stream is closed
    # and the generation stops (or the request leaves the queue).
    async with aclosing(events):
        async for event in events:
            if isinstance(event, FinishEvent):
                finishes[event.index] = event
            else:
                parts.setdefault(event.index, []).append(event.text)
                reasoning.setdefault(event.index, []).append(event.reasoning)
                logprobs.setdefault(event.index, []).extend(event.logprobs)
    if not finishes:
        raise GenerationFailed("the engine stream ended without a finish event")
    choices = []
    for index in sorted(finishes):
        finish = finishes[index]
        message = {"role": "assistant", "content": "".join(parts.get(index, ()))}
        thought = "".join(reasoning.get(index, ()))
        if thought:
            message["reasoning_content"] = thought
        if finish.tool_calls:
            message["tool_calls"] = [tool_call_json(call) for call in finish.tool_calls]
            if not message["content"]:
                message["content"] = None  # a pure call (the contract)
        choice = {
            "index": index,
            "message": message,
            "finish_reason": finish.finish_reason,
        }
        if finish.tool_call_errors:
            choice["tool_call_error"] = tool_call_error_json(finish.tool_call_errors[0])
        if completion.logprobs:
            choice["logprobs"] = logprobs_json(logprobs.get(index, ()))
        choices.append(choice)
    body = {
        "id": completion.id,
        "object": "chat.completion",
        "created": completion.created,
        "model": completion.model,
        "choices": choices,
        "usage": request_usage(finishes),
    }
    n_status = completion.n_status(len(finishes))
    if n_status:
        body["n_status"] = n_status
    status = _worst_status(f.response_format_status for f in finishes.values())
    if status:
        body["response_format_status"] = status
        message = _format_message(
            completion, status, (f.response_format_message for f in finishes.values())
        )
        if message:
            body["response_format_message"] = message
    return json_response(body)


def _format_message(completion: _Completion, status: str | None, messages) -> str:
    """response_format_message: what a downgraded schema dropped, or why an answer is
    not_enforced when its check could not finish (it timed out)."""
    if status == "schema_downgraded":
        return completion.format_message
    if status == "not_enforced":
        return next((m for m in messages if m), "")
    return ""


async def _stream(
    events: AsyncGenerator, completion: _Completion, include_usage: bool
) -> HttpResponse:
    # Wait for the first event before answering: refusals the engine can know up front
    # (context_over_budget, server_busy after a queue wait, memory) then still get their
    # real status code.
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
    """Each choice: its role chunk, its content chunks, its closing chunk; with n > 1 the
    choices' chunks interleave as they are produced, told apart by `index`."""
    opened: set[int] = set()
    finishes: dict[int, FinishEvent] = {}
    choices = first.choices if isinstance(first, FinishEvent) else completion.n
    try:
        event: TokenEvent | FinishEvent | None = first
        while event is not None:
            if event.index not in opened:
                opened.add(event.index)
                yield completion.chunk({"role": "assistant"}, index=event.index)
            if isinstance(event, FinishEvent):
                finishes[event.index] = event
                choices = event.choices
                yield _closing_chunk(
                    completion,
                    event.index,
                    event.finish_reason,
                    choices,
                    event.response_format_status,
                    event.tool_call_errors,
                    event.response_format_message,
                )
            else:
                for chunk in _token_chunks(completion, event):
                    yield chunk
            event = await anext(events, None)
    except ContextOverBudget as exc:
        # The status line is gone; the contract's terminal error event ends the stream.
        yield sse_data(api_error_from(exc, stream=True).body())
        return
    except Exception:
        # Other failures close the choices normally (the contract); the log has the why.
        log.exception("generation %s failed after the stream opened", completion.id)
    finally:
        # Runs on normal end, on failure, and when the client disconnects (the handler
        # closes or cancels this generator): the engine stops generating.
        await events.aclose()
    for index in range(choices):
        if index not in finishes:
            if index not in opened:
                yield completion.chunk({"role": "assistant"}, index=index)
            yield _closing_chunk(completion, index, "stop", choices)
    if include_usage and finishes:
        yield completion.usage_chunk(request_usage(finishes))
    yield DONE


def _token_chunks(completion: _Completion, event: TokenEvent):
    """Reasoning first, then answer text (the contract's delta order); the token's
    logprobs ride the chunk that carries it (the last one)."""
    logprobs = logprobs_json(event.logprobs) if completion.logprobs and event.logprobs else None
    deltas = []
    if event.reasoning:
        deltas.append({"reasoning_content": event.reasoning})
    if event.text:
        deltas.append({"content": event.text})
    for delta in event.tool_calls:
        deltas.append({"tool_calls": [tool_call_delta_json(delta)]})
    if not deltas and logprobs is not None:
        deltas.append({"content": ""})  # a token whose text is still held back
    for i, delta in enumerate(deltas):
        last = i == len(deltas) - 1
        yield completion.chunk(delta, index=event.index, logprobs=logprobs if last else None)


def _closing_chunk(
    completion: _Completion,
    index: int,
    reason: str,
    choices: int,
    format_status: str | None = None,
    call_errors: tuple = (),
    format_message: str = "",
) -> bytes:
    n_status = completion.n_status(choices)
    top = {"n_status": n_status} if n_status else {}
    if call_errors:
        top["tool_call_error"] = tool_call_error_json(call_errors[0])
    if format_status:
        top["response_format_status"] = format_status
        message = _format_message(completion, format_status, (format_message,))
        if message:
            top["response_format_message"] = message
    return completion.chunk({}, reason, index=index, **top)


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
        name, svc = runtime.resolve(model)
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
