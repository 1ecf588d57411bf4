"""The engine's event stream rendered as an OpenAI Responses object and its SSE events.

One builder for both answers: the non-streamed body is the builder's final response
after every event went through it, the stream is the events it emits on the way, so the
streamed events join to the non-streamed body by construction. Output items appear in
the order their first token does: a reasoning item (closed when anything else starts),
the assistant message, then one function_call item per call the model opens; all but
the reasoning item are closed at the finish, in that order.
"""

from __future__ import annotations

import json
import re
import secrets
import time

from engine import ArgumentsDelta, CallOpened, FinishEvent, TokenEvent, Usage
from wire.openai_chat.render import tool_call_error_json

# finish_reason -> (response status, incomplete_details.reason or None)
INCOMPLETE = {"length": "max_output_tokens"}


ID_HEX = 24  # random bytes in an id, written as hex


def new_id(prefix: str) -> str:
    return f"{prefix}_{secrets.token_hex(ID_HEX)}"


def is_response_id(value: str) -> bool:
    """Whether `value` is shaped like the ids new_id("resp") makes."""
    return re.fullmatch(f"resp_[0-9a-f]{{{2 * ID_HEX}}}", value) is not None


def usage_json(usage: Usage) -> dict:
    body = {
        "input_tokens": usage.prompt_tokens,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens, "cache_write_tokens": 0},
        "output_tokens": usage.completion_tokens,
        "output_tokens_details": {"reasoning_tokens": usage.reasoning_tokens},
        "total_tokens": usage.total_tokens,
    }
    if usage.truncated_messages:  # truncation "auto" dropped the oldest turns
        body["truncated_messages"] = usage.truncated_messages
    return body


def logprob_json(entry, with_bytes: bool) -> dict:
    body = {"token": entry.token, "logprob": entry.logprob}
    if with_bytes:
        body["bytes"] = list(entry.bytes)
    top = []
    for token, logprob, raw in entry.top:
        alt = {"token": token, "logprob": logprob}
        if with_bytes:
            alt["bytes"] = list(raw)
        top.append(alt)
    body["top_logprobs"] = top
    return body


class _Item:
    def __init__(self, index: int, body: dict):
        self.index = index
        self.body = body
        self.done = False
        self.pieces: list[str] = []
        self.logprobs: list = []

    @property
    def id(self) -> str:
        return self.body["id"]


class ResponseBuilder:
    """Feed it the engine's events (`push`, then `finish`); each call returns the SSE
    events (dicts with `type` and `sequence_number`) that step produces."""

    def __init__(self, response: dict, *, logprobs: bool = False):
        self.response = response  # the response object; `output` is filled in here
        self.logprobs = logprobs
        self.sequence = 0
        self.items: list[_Item] = []
        self.reasoning: _Item | None = None
        self.message: _Item | None = None
        self.calls: dict[int, _Item] = {}  # by the dialect's call index
        self.pending_logprobs: list = []

    # --- events ----------------------------------------------------------------------

    def event(self, type_: str, **fields: object) -> dict:
        body = {"type": type_, "sequence_number": self.sequence, **fields}
        self.sequence += 1
        return body

    def snapshot(self) -> dict:
        return json.loads(json.dumps(self.response))

    def opening(self) -> list[dict]:
        """response.created and response.in_progress (the response as it starts)."""
        self.response["status"] = "in_progress"
        return [
            self.event("response.created", response=self.snapshot()),
            self.event("response.in_progress", response=self.snapshot()),
        ]

    def push(self, event: TokenEvent) -> list[dict]:
        out: list[dict] = []
        if event.reasoning:
            out += self._reasoning_delta(event.reasoning)
        if event.text:
            out += self._close_reasoning()
            out += self._text_delta(event.text, self._take_logprobs(event))
        elif not event.reasoning and not event.tool_calls and event.logprobs:
            self.pending_logprobs.extend(event.logprobs)  # a token whose text is held back
        for delta in event.tool_calls:
            out += self._close_reasoning()
            if isinstance(delta, CallOpened):
                out += self._call_opened(delta)
            elif isinstance(delta, ArgumentsDelta) and delta.index in self.calls:
                item = self.calls[delta.index]
                item.pieces.append(delta.text)
                out.append(
                    self.event(
                        "response.function_call_arguments.delta",
                        item_id=item.id,
                        output_index=item.index,
                        delta=delta.text,
                    )
                )
        return out

    def finish(self, finish: FinishEvent) -> list[dict]:
        """Close every item; the response's status, usage and output are set."""
        reason = INCOMPLETE.get(finish.finish_reason)
        status = "incomplete" if reason else "completed"
        out = self._close_reasoning()
        parsed = {call.id: call for call in finish.tool_calls}
        if self.message is None and not self.calls and not parsed:
            out += self._open_message()  # an empty answer is still a message
        if self.message is not None:
            if self.pending_logprobs:
                self.message.logprobs.extend(self._logprobs(self.pending_logprobs))
                self.pending_logprobs = []
            out += self._close_message(status)
        for item in list(self.calls.values()):
            call = parsed.pop(item.body["call_id"], None)
            arguments = json.dumps(call.arguments) if call else "".join(item.pieces)
            out += self._close_call(item, arguments, "completed" if call else "incomplete")
        for call in parsed.values():  # parsed at the end, never announced as it streamed
            item = self._add_call(call.id, call.name)
            out.append(self._item_added(item))
            out += self._close_call(item, json.dumps(call.arguments), "completed")
        self.response["status"] = status
        self.response["incomplete_details"] = {"reason": reason} if reason else None
        self.response["usage"] = usage_json(finish.usage)
        if finish.response_format_status:
            self.response["response_format_status"] = finish.response_format_status
        if finish.tool_call_errors:  # a call dropped (unknown tool, malformed): say why
            self.response["tool_call_error"] = tool_call_error_json(finish.tool_call_errors[0])
        if status == "completed":
            self.response["completed_at"] = int(time.time())
        self.response["output"] = [item.body for item in self.items]
        return out

    def closing(self) -> dict:
        """The terminal event: response.completed or response.incomplete."""
        kind = "response.incomplete" if self.response["status"] == "incomplete" else ""
        return self.event(kind or "response.completed", response=self.snapshot())

    # --- items -------------------------------------------------------------------------

    def _add(self, body: dict) -> _Item:
        item = _Item(len(self.items), body)
        self.items.append(item)
        return item

    def _item_added(self, item: _Item) -> dict:
        return self.event(
            "response.output_item.added",
            output_index=item.index,
            item=json.loads(json.dumps(item.body)),
        )

    def _item_done(self, item: _Item) -> dict:
        item.done = True
        return self.event(
            "response.output_item.done",
            output_index=item.index,
            item=json.loads(json.dumps(item.body)),
        )

    def _reasoning_delta(self, text: str) -> list[dict]:
        out = []
        item = self.reasoning
        if item is None or item.done:
            item = self.reasoning = self._add(
                {
                    "id": new_id("rs"),
                    "type": "reasoning",
                    "summary": [],
                    "content": [],
                    "status": "in_progress",
                }
            )
            out.append(self._item_added(item))
            out.append(
                self.event(
                    "response.content_part.added",
                    item_id=item.id,
                    output_index=item.index,
                    content_index=0,
                    part={"type": "reasoning_text", "text": ""},
                )
            )
        item.pieces.append(text)
        out.append(
            self.event(
                "response.reasoning_text.delta",
                item_id=item.id,
                output_index=item.index,
                content_index=0,
                delta=text,
            )
        )
        return out

    def _close_reasoning(self) -> list[dict]:
        item = self.reasoning
        if item is None or item.done:
            return []
        text = "".join(item.pieces)
        part = {"type": "reasoning_text", "text": text}
        item.body["content"] = [part]
        item.body["status"] = "completed"
        common = {"item_id": item.id, "output_index": item.index, "content_index": 0}
        return [
            self.event("response.reasoning_text.done", **common, text=text),
            self.event("response.content_part.done", **common, part=part),
            self._item_done(item),
        ]

    def _open_message(self) -> list[dict]:
        item = self.message = self._add(
            {
                "id": new_id("msg"),
                "type": "message",
                "status": "in_progress",
                "role": "assistant",
                "content": [],
            }
        )
        part = {"type": "output_text", "text": "", "annotations": []}
        if self.logprobs:
            part["logprobs"] = []
        return [
            self._item_added(item),
            self.event(
                "response.content_part.added",
                item_id=item.id,
                output_index=item.index,
                content_index=0,
                part=part,
            ),
        ]

    def _text_delta(self, text: str, logprobs: list) -> list[dict]:
        out = self._open_message() if self.message is None else []
        item = self.message
        item.pieces.append(text)
        item.logprobs.extend(self._logprobs(logprobs, with_bytes=True))
        out.append(
            self.event(
                "response.output_text.delta",
                item_id=item.id,
                output_index=item.index,
                content_index=0,
                delta=text,
                logprobs=self._logprobs(logprobs),
            )
        )
        return out

    def _close_message(self, status: str) -> list[dict]:
        item = self.message
        text = "".join(item.pieces)
        part = {"type": "output_text", "text": text, "annotations": []}
        if self.logprobs:
            part["logprobs"] = item.logprobs
        item.body["content"] = [part]
        item.body["status"] = status
        common = {"item_id": item.id, "output_index": item.index, "content_index": 0}
        return [
            self.event(
                "response.output_text.done",
                **common,
                text=text,
                logprobs=[{k: v for k, v in lp.items() if k != "bytes"} for lp in item.logprobs],
            ),
            self.event("response.content_part.done", **common, part=part),
            self._item_done(item),
        ]

    def _add_call(self, call_id: str, name: str) -> _Item:
        return self._add(
            {
                "id": new_id("fc"),
                "type": "function_call",
                "call_id": call_id,
                "name": name,
                "arguments": "",
                "status": "in_progress",
            }
        )

    def _call_opened(self, delta: CallOpened) -> list[dict]:
        item = self.calls[delta.index] = self._add_call(delta.id, delta.name)
        return [self._item_added(item)]

    def _close_call(self, item: _Item, arguments: str, status: str) -> list[dict]:
        item.body["arguments"] = arguments
        item.body["status"] = status
        return [
            self.event(
                "response.function_call_arguments.done",
                item_id=item.id,
                output_index=item.index,
                arguments=arguments,
            ),
            self._item_done(item),
        ]

    # --- logprobs ----------------------------------------------------------------------

    def _take_logprobs(self, event: TokenEvent) -> list:
        if not self.logprobs:
            return []
        entries = [*self.pending_logprobs, *event.logprobs]
        self.pending_logprobs = []
        return entries

    def _logprobs(self, entries, with_bytes: bool = False) -> list[dict]:
        if not self.logprobs:
            return []
        return [logprob_json(e, with_bytes) for e in entries]


def sse_event(event: dict) -> bytes:
    """One SSE event: `event: <type>` and its JSON `data:` (compact)."""
    data = json.dumps(event, ensure_ascii=False, separators=(",", ":"))
    return f"event: {event['type']}\ndata: {data}\n\n".encode()
