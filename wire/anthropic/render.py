"""The chat core's events as Anthropic Messages: content blocks, the streamed event
sequence, usage, stop reasons and Anthropic's error shape.

One `Blocks` builder turns a turn's TokenEvents into content blocks (thinking, text,
tool_use, in the order the model wrote them); the stream sends what it builds as it is
built and the non-streamed body is what it built, so the two cannot disagree.
"""

from __future__ import annotations

import json
import logging
from collections.abc import AsyncIterator

from django.http import HttpResponse

from engine import (
    ArgumentsDelta,
    CallOpened,
    ContextOverBudget,
    FinishEvent,
    GenerationFailed,
    TokenEvent,
    Usage,
)
from pantheon_platform.chat_http import StartedTurn, one_choice
from pantheon_platform.errors import (
    ApiError,
    anthropic_error_body,
    api_error_from,
    json_response,
)
from wire.openai_chat.render import tool_call_error_json

log = logging.getLogger("pantheon.http")

# The core's finish reasons as Anthropic's stop_reason (a loop cut by the detector ends
# the turn: Anthropic has no reason for it).
STOP_REASONS = {
    "stop": "end_turn",
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "repetition_loop": "end_turn",
}

# Anthropic's error types, by the status our error carries.


def sse_event(name: str, payload: dict) -> bytes:
    """One server-sent event with its `event:` line, as Anthropic sends them."""
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return f"event: {name}\ndata: {data}\n\n".encode()


def stop_reason(finish: FinishEvent) -> tuple[str, str | None]:
    """(stop_reason, stop_sequence)."""
    if finish.finish_reason != "tool_calls" and finish.stop_sequence:
        return "stop_sequence", finish.stop_sequence
    return STOP_REASONS.get(finish.finish_reason, "end_turn"), None


def usage_json(usage: Usage) -> dict:
    """Anthropic's usage: `input_tokens` are the prompt tokens read from no cache,
    `cache_read_input_tokens` those a session's parked conversation supplied (their sum
    is the prompt). Nothing is billed for writing the cache: creation is 0."""
    return {
        "input_tokens": usage.prompt_tokens - usage.cached_tokens,
        "output_tokens": usage.completion_tokens,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": usage.cached_tokens,
    }


class Blocks:
    """One answer's content blocks, built from its events in order. `push` and `close`
    return the stream events (name, payload) for what they changed."""

    def __init__(self) -> None:
        self.blocks: list[dict] = []
        self.open: str | None = None  # the type of the block being written, if any
        self.arguments: dict[int, list[str]] = {}  # tool_use block index -> JSON pieces

    def push(self, event: TokenEvent) -> list[tuple[str, dict]]:
        out: list[tuple[str, dict]] = []
        if event.reasoning:
            out += self._write("thinking", {"type": "thinking_delta", "thinking": event.reasoning})
        if event.text:
            out += self._write("text", {"type": "text_delta", "text": event.text})
        for delta in event.tool_calls:
            if isinstance(delta, CallOpened):
                out += self.close()
                out += self._start({"type": "tool_use", "id": delta.id, "name": delta.name})
                self.arguments[len(self.blocks) - 1] = []
            elif isinstance(delta, ArgumentsDelta) and self.open == "tool_use" and delta.text:
                index = len(self.blocks) - 1
                self.arguments[index].append(delta.text)
                out.append(_delta(index, {"type": "input_json_delta", "partial_json": delta.text}))
        return out

    def close(self) -> list[tuple[str, dict]]:
        if self.open is None:
            return []
        self.open = None
        index = len(self.blocks) - 1
        return [("content_block_stop", {"type": "content_block_stop", "index": index})]

    def content(self, finish: FinishEvent) -> list[dict]:
        """The finished blocks: a tool_use block's input is the call as parsed, or for a
        call the token limit cut, the members its streamed JSON holds."""
        parsed = {call.id: call.arguments for call in finish.tool_calls}
        out = []
        for index, block in enumerate(self.blocks):
            block = dict(block)
            if block["type"] == "tool_use":
                if block["id"] in parsed:
                    block["input"] = parsed[block["id"]]
                else:
                    block["input"] = _json_object("".join(self.arguments.get(index, ())))
            out.append(block)
        return out

    def _write(self, kind: str, delta: dict) -> list[tuple[str, dict]]:
        out: list[tuple[str, dict]] = []
        if self.open != kind:
            out += self.close()
            start = {"type": "text", "text": ""}
            if kind == "thinking":
                start = {"type": "thinking", "thinking": "", "signature": ""}
            out += self._start(start)
        block = self.blocks[-1]
        field = "thinking" if kind == "thinking" else "text"
        block[field] += delta[field]
        out.append(_delta(len(self.blocks) - 1, delta))
        return out

    def _start(self, block: dict) -> list[tuple[str, dict]]:
        self.blocks.append(block)
        self.open = block["type"]
        shown = dict(block, input={}) if block["type"] == "tool_use" else dict(block)
        return [
            (
                "content_block_start",
                {
                    "type": "content_block_start",
                    "index": len(self.blocks) - 1,
                    "content_block": shown,
                },
            )
        ]


def _delta(index: int, delta: dict) -> tuple[str, dict]:
    return ("content_block_delta", {"type": "content_block_delta", "index": index, "delta": delta})


def _json_object(text: str) -> dict:
    """A cut call's streamed arguments as an object. The dialects stream whole members
    (`{"a": 1`, `, "b": "x"`, then `}`), so a cut one lacks only its `}`: read as the SDK's
    partial JSON reads it."""
    for candidate in (text, text + "}"):
        try:
            value = json.loads(candidate)
        except ValueError:
            continue
        return value if isinstance(value, dict) else {}
    return {}


def message_json(
    message_id: str, model: str, content: list[dict], finish: FinishEvent | None, usage: dict
) -> dict:
    reason, sequence = stop_reason(finish) if finish is not None else (None, None)
    return {
        "id": message_id,
        "type": "message",
        "role": "assistant",
        "model": model,
        "content": content,
        "stop_reason": reason,
        "stop_sequence": sequence,
        "usage": usage,
        **call_error(finish),
    }


def call_error(finish: FinishEvent | None) -> dict:
    """`tool_call_error` (the chat route's object) when a call the model wrote was dropped
    (an unknown tool, malformed, cut short): not a tool_use block, but never silent."""
    if finish is None or not finish.tool_call_errors:
        return {}
    return {"tool_call_error": tool_call_error_json(finish.tool_call_errors[0])}


# --- errors ------------------------------------------------------------------------------


def anthropic_error(exc: Exception) -> ApiError:
    """The exception as our ApiError with Anthropic's status conventions: an over-long
    prompt is 400 "prompt is too long: N tokens > M maximum" (what Anthropic answers and
    its clients recognise, LangChain's ChatAnthropic among them)."""
    if isinstance(exc, ContextOverBudget):
        count = f"at least {exc.prompt_tokens}" if exc.at_least else str(exc.prompt_tokens)
        return ApiError(
            400,
            f"prompt is too long: {count} tokens > {exc.kv_cap} maximum (the model's "
            "context window); shorten the conversation and retry",
            "invalid_request_error",
        )
    return api_error_from(exc)


def error_json(error: ApiError) -> dict:
    body = anthropic_error_body(error.status, error.message)
    if "details" in error.extra:  # an error code the SDK maps to its own class
        body["error"]["details"] = error.extra["details"]
    return body


def error_response(error: ApiError):
    return json_response(error_json(error), status=error.status, headers=error.headers)


def error_event(error: ApiError) -> bytes:
    return sse_event("error", error_json(error))


# --- a turn's answer ---------------------------------------------------------------------


async def complete(started: StartedTurn, message_id: str) -> HttpResponse:
    blocks = Blocks()
    finish = await one_choice(started.events, blocks.push)
    body = message_json(
        message_id, started.model, blocks.content(finish), finish, usage_json(finish.usage)
    )
    return json_response(body)


async def stream_events(
    started: StartedTurn, message_id: str, first: TokenEvent | FinishEvent
) -> AsyncIterator[bytes]:
    events = started.events
    start = message_json(message_id, started.model, [], None, start_usage(started))
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
            **call_error(finish),
        },
    )
    yield sse_event("message_stop", {"type": "message_stop"})


def start_usage(started: StartedTurn) -> dict:
    """message_start's usage: the prompt as prepared; what the session cache supplied is
    known when the turn ends (message_delta's usage carries the final counts)."""
    return {
        "input_tokens": started.prepared.prompt_tokens,
        "output_tokens": 0,
        "cache_creation_input_tokens": 0,
        "cache_read_input_tokens": 0,
    }
