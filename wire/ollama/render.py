"""The chat core's events as Ollama answers: NDJSON chunks, the final `done` object with
its counts and durations (ns, measured), model rows for /api/tags, /api/ps, /api/show,
and Ollama's error shape ({"error": "message"})."""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime

from django.http import HttpResponse, StreamingHttpResponse

from engine import (
    DEFAULT_TEMPERATURE,
    DEFAULT_TOP_K,
    DEFAULT_TOP_P,
    CallJoiner,
    ContextOverBudget,
    FinishEvent,
    GenerationFailed,
    TokenEvent,
    ToolCall,
)
from pantheon_platform.chat_http import one_choice
from pantheon_platform.errors import ApiError, api_error_from, json_response
from wire.openai_chat.render import tool_call_error_json

log = logging.getLogger("pantheon.http")

NDJSON = "application/x-ndjson"
# The core's finish reasons as Ollama's done_reason: a tool call ends the turn ("stop",
# as Ollama says); a loop cut by the detector is said as such.
DONE_REASONS = {"stop": "stop", "length": "length", "tool_calls": "stop"}
# Models stay loaded until an operator unloads them: /api/ps shows no expiry in reach.
NEVER = "9999-12-31T23:59:59Z"
# Metadata arrays longer than this (the vocabulary, merges) are null in /api/show's
# model_info, as Ollama shows them without `verbose`.
MAX_INFO_LIST = 64


def now() -> str:
    return rfc3339(time.time())


def rfc3339(seconds: float) -> str:
    return datetime.fromtimestamp(seconds, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def line(payload: dict) -> bytes:
    """One NDJSON line."""
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"


class NdjsonResponse(StreamingHttpResponse):
    """application/x-ndjson fed by an async generator of lines, each sent as produced
    (as pantheon_platform.sse.EventStreamResponse: a sync iterator would be buffered whole under
    Daphne, and the generator itself is handed out so a disconnect closes it at once)."""

    def __init__(self, lines):
        super().__init__(lines, content_type=NDJSON)
        self["Cache-Control"] = "no-cache"
        self["X-Accel-Buffering"] = "no"

    def __aiter__(self):
        return self._iterator


# --- errors ------------------------------------------------------------------------------


def ollama_error(exc: Exception) -> ApiError:
    """The exception as our ApiError with Ollama's conventions: an over-long prompt is a
    400, as on every route."""
    if isinstance(exc, ContextOverBudget):
        return ApiError(400, str(exc), "invalid_request_error")
    return api_error_from(exc)


def error_response(error: ApiError):
    return json_response({"error": error.message}, status=error.status, headers=error.headers)


def error_line(error: ApiError) -> bytes:
    return line({"error": error.message})


# --- the answer ----------------------------------------------------------------------


@dataclass
class Clock:
    """The request's measured phases (time.perf_counter_ns): `start` (the view began),
    `ready` (model resolved, turn prepared: template and tokenizer), `first` (the first
    event: the prompt evaluated and the first token sampled), `end` (the finish)."""

    start: int = field(default_factory=time.perf_counter_ns)
    ready: int = 0
    first: int = 0
    end: int = 0

    def mark_ready(self) -> None:
        self.ready = time.perf_counter_ns()

    def mark_first(self) -> None:
        if not self.first:
            self.first = time.perf_counter_ns()

    def mark_end(self) -> None:
        """The finish; an answer that showed nothing before it (held-back tool markup)
        has its first event here too, never after the end (eval_duration >= 0)."""
        self.mark_first()
        self.end = max(time.perf_counter_ns(), self.first)


def done_fields(finish: FinishEvent, clock: Clock) -> dict:
    usage = finish.usage
    reason = DONE_REASONS.get(finish.finish_reason, finish.finish_reason)
    dropped = finish.tool_call_errors
    # A call the model wrote and that was dropped (an unknown tool, malformed, cut
    # short): the chat route's `tool_call_error` object, never silent.
    error = {"tool_call_error": tool_call_error_json(dropped[0])} if dropped else {}
    return {
        "done": True,
        "done_reason": reason,
        "total_duration": clock.end - clock.start,
        # The model is resident (operators load it): this is the request's preparation.
        "load_duration": clock.ready - clock.start,
        "prompt_eval_count": usage.prompt_tokens,
        "prompt_eval_duration": clock.first - clock.ready,
        "eval_count": usage.completion_tokens,
        "eval_duration": clock.end - clock.first,
        **error,
    }


def logprobs_json(entries) -> list[dict]:
    return [
        {
            "token": e.token,
            "logprob": e.logprob,
            "bytes": list(e.bytes),
            "top_logprobs": [{"token": t, "logprob": lp, "bytes": list(b)} for t, lp, b in e.top],
        }
        for e in entries
    ]


def tool_calls_json(calls: list[ToolCall]) -> list[dict]:
    """Ollama's tool calls: arguments as an object (a call the token limit cut holds what
    parses of it, {} when nothing does)."""
    out = []
    for index, call in enumerate(calls):
        try:
            arguments = json.loads(call.arguments)
        except ValueError:
            arguments = {}
        if not isinstance(arguments, dict):
            arguments = {}
        out.append(
            {
                "id": call.id,
                "function": {"index": index, "name": call.name, "arguments": arguments},
            }
        )
    return out


class Answer:
    """One turn's events as Ollama chunks: `push` gives the chunk for a TokenEvent (None
    when it carries nothing to show), `finish` the tool-call chunk (if any) and the final
    object. The joined answer (`stream: false`) is the same pieces joined."""

    def __init__(self, model: str, chat: bool, logprobs: bool, clock: Clock):
        self.model = model
        self.chat = chat
        self.logprobs = logprobs
        self.clock = clock
        self.text: list[str] = []
        self.thinking: list[str] = []
        self.entries: list = []
        self.calls = CallJoiner()

    def _body(self, text: str, thinking: str, entries=(), calls=None) -> dict:
        body: dict = {"model": self.model, "created_at": now()}
        if self.chat:
            message: dict = {"role": "assistant", "content": text}
            if thinking:
                message["thinking"] = thinking
            if calls:
                message["tool_calls"] = calls
            body["message"] = message
        else:
            body["response"] = text
            if thinking:
                body["thinking"] = thinking
        if self.logprobs and entries:
            body["logprobs"] = logprobs_json(entries)
        return body

    def push(self, event: TokenEvent) -> dict | None:
        self.clock.mark_first()
        self.text.append(event.text)
        self.thinking.append(event.reasoning)
        self.entries.extend(event.logprobs)
        if event.tool_calls:
            self.calls.push(event.tool_calls)
        if not (event.text or event.reasoning or (self.logprobs and event.logprobs)):
            return None
        return {**self._body(event.text, event.reasoning, event.logprobs), "done": False}

    def finish(self, finish: FinishEvent) -> list[dict]:
        """The streamed ending: the calls (whole, with their arguments) in a chunk of
        their own, then the final object."""
        self.clock.mark_end()
        out = []
        calls = self.calls.calls(finish)
        if calls:
            out.append({**self._body("", "", calls=tool_calls_json(calls)), "done": False})
        out.append({**self._body("", ""), **done_fields(finish, self.clock)})
        return out

    def joined(self, finish: FinishEvent) -> dict:
        """The non-streamed answer: every piece joined, with the final object's fields."""
        self.clock.mark_end()
        calls = self.calls.calls(finish)
        body = self._body(
            "".join(self.text),
            "".join(self.thinking),
            self.entries,
            tool_calls_json(calls) if calls else None,
        )
        return {**body, **done_fields(finish, self.clock)}


def load_answer(model: str, chat: bool) -> dict:
    """Ollama's answer to a request with no prompt ("load the model"): it is loaded."""
    body: dict = {"model": model, "created_at": now()}
    if chat:
        body["message"] = {"role": "assistant", "content": ""}
    else:
        body["response"] = ""
    return {**body, "done": True, "done_reason": "load"}


# --- models --------------------------------------------------------------------------


def parameter_size(svc) -> str:
    label = svc.gguf.metadata.get("general.size_label")
    if isinstance(label, str) and label:
        return label
    return _size_label(svc.gguf.n_params)


def _size_label(n: int) -> str:
    for unit, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f}{unit}".replace(".0", "")
    return str(n)


def details(svc) -> dict:
    arch = svc.architecture
    return {
        "parent_model": "",
        "format": "gguf",
        "family": arch,
        "families": [arch],
        "parameter_size": parameter_size(svc),
        "quantization_level": svc.quantization,
    }


def _file(svc) -> tuple[int, float]:
    try:
        st = os.stat(svc.path)
    except OSError:
        return 0, float(getattr(svc, "created", 0))
    return st.st_size, st.st_mtime


def tags_row(name: str, svc) -> dict:
    size, mtime = _file(svc)
    return {
        "name": name,
        "model": name,
        "modified_at": rfc3339(mtime),
        "size": size,
        "digest": svc.weights_version,
        "details": details(svc),
    }


def discovered_tags_row(name: str, found) -> dict:
    """A model on disk not loaded yet (pantheon_platform.discovery.FoundModel), as
    /api/tags lists it: its GGUF header read for the details (cached by size and mtime)."""
    from pantheon_platform.model_files import model_file_info

    row = {
        "name": name,
        "model": name,
        "modified_at": rfc3339(found.modified),
        "size": found.size_bytes,
        "digest": found.digest,
    }
    try:
        info = model_file_info(found.path)
    except (OSError, ValueError):
        return row
    row["details"] = {
        "parent_model": "",
        "format": "gguf",
        "family": info.architecture,
        "families": [info.architecture],
        "parameter_size": _size_label(info.n_params),
        "quantization_level": info.quantization,
    }
    return row


def ps_row(name: str, svc) -> dict:
    size, _ = _file(svc)
    return {
        "name": name,
        "model": name,
        "size": size,
        "digest": svc.weights_version,
        "details": details(svc),
        "expires_at": NEVER,
        "size_vram": 0,
        "context_length": svc.context_window,
    }


def model_info(svc, verbose: bool = False) -> dict:
    """The GGUF's metadata under its own keys ("general.architecture",
    "<arch>.context_length", ...), with general.parameter_count; long arrays (vocabulary,
    merges) null unless `verbose`; the chat template is /api/show's `template`."""
    out: dict = {}
    for key, value in svc.gguf.metadata.items():
        if key == "tokenizer.chat_template":
            continue
        if isinstance(value, list) and len(value) > MAX_INFO_LIST and not verbose:
            value = None
        out[key] = value
    out["general.parameter_count"] = svc.gguf.n_params
    return dict(sorted(out.items()))


def capabilities(svc) -> list[str]:
    caps = ["completion", "tools"]
    if svc.think_style or svc.harmony:
        caps.append("thinking")
    return caps


def show_body(name: str, svc, verbose: bool = False, *, full_path: bool = False) -> dict:
    """/api/show's body. The modelfile's FROM names the GGUF's file name only: its
    absolute path is the server's own business, shown only to an operator (`full_path`)."""
    _, mtime = _file(svc)
    source = svc.path if full_path else os.path.basename(str(svc.path))
    window = svc.context_window
    parameters = "\n".join(
        f"{key:<30} {value}"
        for key, value in (
            ("num_ctx", window),
            ("temperature", DEFAULT_TEMPERATURE),
            ("top_k", DEFAULT_TOP_K),
            ("top_p", DEFAULT_TOP_P),
        )
    )
    return {
        "modelfile": f"# Served by Pantheon as {name}\nFROM {source}\n",
        "parameters": parameters,
        "template": svc.template.source,
        "details": details(svc),
        "model_info": model_info(svc, verbose),
        "capabilities": capabilities(svc),
        "modified_at": rfc3339(mtime),
        "context_length": window,
    }


# --- a turn's answer ---------------------------------------------------------------------


async def complete(
    events: AsyncIterator, answer: Answer, turn_over: Callable[[], None]
) -> HttpResponse:
    """The non-streamed answer: the turn's events joined into one object. `turn_over`
    runs once the engine stream is closed (the turn has parked its KV)."""
    finish = await one_choice(events, answer.push)
    turn_over()
    return json_response(answer.joined(finish))


async def lines(
    events: AsyncIterator,
    answer: Answer,
    first: TokenEvent | FinishEvent,
    turn_over: Callable[[], None],
) -> AsyncIterator[bytes]:
    """The streamed answer: a line per chunk, then the `done` object; an error after the
    stream opened is its last line. `turn_over` runs once the engine stream is closed."""
    finish: FinishEvent | None = None
    try:
        event: TokenEvent | FinishEvent | None = first
        while event is not None:
            if isinstance(event, FinishEvent):
                finish = event
            else:
                chunk = answer.push(event)
                if chunk is not None:
                    yield line(chunk)
            event = await anext(events, None)
    except Exception as exc:
        # The status line is gone: Ollama ends such a stream with an error line.
        error = ollama_error(exc)
        if error.status == 500:
            log.error("ollama stream failed after it opened", exc_info=exc)
        yield error_line(error)
        return
    finally:
        # On normal end, on failure, and when the client disconnects: the engine stops.
        await events.aclose()
    if finish is None:
        yield error_line(ollama_error(GenerationFailed("the engine stream ended without a finish")))
        return
    turn_over()
    for chunk in answer.finish(finish):
        yield line(chunk)
