"""POST /v1/chat/completions as a wire format over the chat core: the validated request
becomes a `Turn`; the core's events become the OpenAI chat JSON or its SSE chunks."""

from __future__ import annotations

import logging
import secrets
import time
from collections.abc import AsyncGenerator, AsyncIterator
from dataclasses import dataclass

from django.http import HttpResponse, JsonResponse

from engine import (
    CallOpened,
    ContextOverBudget,
    FinishEvent,
    TokenEvent,
    ToolCall,
    Turn,
    TurnResult,
    Usage,
    collect,
    request_usage,
    worst_format_status,
)
from pantheon_platform.errors import api_error_from, json_response
from pantheon_platform.sse import DONE, EventStreamResponse, sse_data

log = logging.getLogger("pantheon.http")


def completion_id() -> str:
    return f"chatcmpl-{secrets.token_hex(12)}"


def turn_of(chat, request_id: str) -> Turn:
    """The validated ChatCompletionRequest as the core's Turn."""
    data = chat.validated_data
    return Turn(
        messages=tuple(data["messages"]),
        tools=tuple(data.get("tools") or ()),
        tool_choice=data.get("tool_choice") or "auto",
        response_format=data.get("response_format"),
        enable_thinking=chat.requested_thinking(),
        reasoning_budget=chat.requested_reasoning_budget(),
        reasoning_effort=data.get("reasoning_effort"),
        sampling=chat.sampling_params(),
        n=chat.n_requested,
        logprobs=chat.wants_logprobs,
        request_id=request_id,
        prediction=data.get("prediction"),
        speculation=data.get("speculation"),
        priority=data.get("priority") or "interactive",
        truncation=data.get("truncation") or "disabled",
    )


# --- JSON pieces -----------------------------------------------------------------------


def tool_call_json(call: ToolCall) -> dict:
    return {
        "id": call.id,
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments},
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


def usage_json(usage: Usage, predicted: bool = False) -> dict:
    """The usage object. completion_tokens_details is there when it has something to say:
    reasoning tokens, or a request that sent a `prediction` (its accepted and rejected
    tokens, as OpenAI reports them, zeros included)."""
    body = {
        "prompt_tokens": usage.prompt_tokens,
        "completion_tokens": usage.completion_tokens,
        "total_tokens": usage.total_tokens,
        "prompt_tokens_details": {"cached_tokens": usage.cached_tokens},
        "kv_used": usage.kv_used,
        "kv_cap": usage.kv_cap,
    }
    predictions = (usage.accepted_prediction_tokens, usage.rejected_prediction_tokens)
    if usage.reasoning_tokens or predicted or any(predictions):
        details = {"reasoning_tokens": usage.reasoning_tokens}
        if predicted or any(predictions):
            details["accepted_prediction_tokens"] = predictions[0]
            details["rejected_prediction_tokens"] = predictions[1]
        body["completion_tokens_details"] = details
    if usage.session_conflict:
        body["session_conflict"] = True
    if usage.truncated_messages:  # truncation "auto" dropped the oldest turns
        body["truncated_messages"] = usage.truncated_messages
    return body


@dataclass(frozen=True)
class Completion:
    id: str
    created: int
    model: str
    n_requested: int = 1
    n: int = 1  # choices asked of the engine (n_requested capped at 8)
    logprobs: bool = False
    format_message: str = ""  # why a schema was downgraded (names the feature)
    predicted: bool = False  # the request sent a `prediction`: usage reports its tokens

    @classmethod
    def of(cls, chat, started) -> Completion:
        prepared = started.prepared
        return cls(
            id=prepared.request.request_id,
            created=int(time.time()),
            model=started.model,
            n_requested=chat.n_requested,
            n=prepared.n,
            logprobs=prepared.turn.logprobs,
            format_message=prepared.format_message,
            predicted=prepared.turn.prediction is not None,
        )

    def n_status(self, choices: int) -> str | None:
        """Why fewer choices came back than `n` asked for (the contract's n_status)."""
        if choices < self.n:
            return "partial_slot_unavailable"
        if self.n < self.n_requested:
            return "capped_to_8"
        return None

    def format_message_for(self, status: str | None, messages) -> str:
        """response_format_message: what a downgraded schema dropped, or why an answer is
        not_enforced when its check could not finish (it timed out)."""
        if status == "schema_downgraded":
            return self.format_message
        if status == "not_enforced":
            return next((m for m in messages if m), "")
        return ""

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


# --- the non-streamed answer -------------------------------------------------------------


def completion_body(result: TurnResult, completion: Completion) -> dict:
    """The chat.completion object: the core's joined events (`collect`)."""
    choices = []
    for joined in result.choices:
        finish = joined.finish
        message = {"role": "assistant", "content": joined.text}
        if joined.reasoning:
            message["reasoning_content"] = joined.reasoning
        if joined.tool_calls:
            message["tool_calls"] = [tool_call_json(call) for call in joined.tool_calls]
            if not message["content"]:
                message["content"] = None  # a pure call (the contract)
        choice = {
            "index": joined.index,
            "message": message,
            "finish_reason": finish.finish_reason,
        }
        if finish.tool_call_errors:
            choice["tool_call_error"] = tool_call_error_json(finish.tool_call_errors[0])
        if completion.logprobs:
            choice["logprobs"] = logprobs_json(joined.logprobs)
        choices.append(choice)
    body = {
        "id": completion.id,
        "object": "chat.completion",
        "created": completion.created,
        "model": completion.model,
        "choices": choices,
        "usage": usage_json(result.usage, completion.predicted),
    }
    finishes = result.finishes
    n_status = completion.n_status(len(finishes))
    if n_status:
        body["n_status"] = n_status
    status = worst_format_status(f.response_format_status for f in finishes.values())
    if status:
        body["response_format_status"] = status
        message = completion.format_message_for(
            status, (f.response_format_message for f in finishes.values())
        )
        if message:
            body["response_format_message"] = message
    return body


async def complete(events: AsyncIterator, completion: Completion) -> JsonResponse:
    # collect closes the stream if this view is cancelled (client gone): the generation
    # stops (or the request leaves the queue).
    return json_response(completion_body(await collect(events), completion))


# --- the stream ----------------------------------------------------------------------------


def stream(
    events: AsyncGenerator,
    first: TokenEvent | FinishEvent,
    completion: Completion,
    include_usage: bool,
) -> HttpResponse:
    """The event stream, once the first event came (wire.route.first_event): refusals the
    engine can know up front (context_over_budget, server_busy after a queue wait,
    memory) still get their real status code."""
    return EventStreamResponse(sse_events(events, first, completion, include_usage))


async def sse_events(
    events: AsyncGenerator,
    first: TokenEvent | FinishEvent,
    completion: Completion,
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
                yield closing_chunk(
                    completion,
                    event.index,
                    event.finish_reason,
                    choices,
                    event.response_format_status,
                    event.tool_call_errors,
                    event.response_format_message,
                )
            else:
                for chunk in token_chunks(completion, event):
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
            yield closing_chunk(completion, index, "stop", choices)
    if include_usage and finishes:
        yield completion.usage_chunk(usage_json(request_usage(finishes), completion.predicted))
    yield DONE


def token_chunks(completion: Completion, event: TokenEvent):
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


def closing_chunk(
    completion: Completion,
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
        message = completion.format_message_for(format_status, (format_message,))
        if message:
            top["response_format_message"] = message
    return completion.chunk({}, reason, index=index, **top)
