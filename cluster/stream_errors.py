"""The last event of a stream whose instance failed mid-answer, in the wire format of the
route it came on: the status line is gone, so the client learns of the failure only from
an event its SDK parses as one (what an instance itself sends when a generation fails
after its stream opened; wire/*/render.py and wire/responses/views.py). The router
cannot import the wire apps (they are its peers), so the shapes are written here."""

from __future__ import annotations

import json
import re

INSTANCE_FAILED = "instance_failed"
SEQUENCE_NUMBER = re.compile(rb'"sequence_number"\s*:\s*(\d+)')
RESPONSE_ID = re.compile(rb'"id"\s*:\s*"(resp_[0-9a-f]+)"')


class StreamTail:
    """What a failure event needs of the stream so far: the Responses API's last sequence
    number and response id (read from the chunks of /v1/responses streams only)."""

    def __init__(self, path: str, content_type: str):
        self.path = path
        self.content_type = content_type.split(";")[0].strip().lower()
        self.watch = path == "/v1/responses" and self.content_type == "text/event-stream"
        self.sequence = -1
        self.response_id: str | None = None
        self.last = b"\n\n"  # the stream's last two bytes: is it cut mid-event?

    def saw(self, chunk: bytes) -> None:
        if chunk:
            self.last = (self.last + chunk)[-2:]
        if not self.watch:
            return
        numbers = SEQUENCE_NUMBER.findall(chunk)
        if numbers:
            self.sequence = int(numbers[-1])
        if self.response_id is None and (found := RESPONSE_ID.search(chunk)):
            self.response_id = found.group(1).decode()

    def failure(self, message: str) -> bytes:
        """The bytes that end the stream as a failure; b"" for a body that is no stream
        (a JSON answer cut short cannot be mended)."""
        if self.content_type == "application/x-ndjson":  # Ollama's streams
            cut = b"" if self.last.endswith(b"\n") else b"\n"
            return cut + _json_line({"error": message})
        if self.content_type != "text/event-stream":
            return b""
        # An event cut half-way is closed first, so the failure parses as its own event.
        return (b"" if self.last == b"\n\n" else b"\n\n") + self._sse_failure(message)

    def _sse_failure(self, message: str) -> bytes:
        if self.path == "/v1/messages":
            error = {"type": "error", "error": {"type": "api_error", "message": message}}
            return _event("error", error)
        if self.watch:
            return self._responses_failure(message)
        error = {"error": {"message": message, "type": INSTANCE_FAILED}}
        return b"data: " + json.dumps(error).encode() + b"\n\n"

    def _responses_failure(self, message: str) -> bytes:
        # As an instance ends a failed stream: an `error` event, then response.failed.
        error = {
            "type": "error",
            "sequence_number": self.sequence + 1,
            "code": INSTANCE_FAILED,
            "message": message,
            "param": None,
        }
        response = {
            "id": self.response_id,
            "object": "response",
            "status": "failed",
            "error": {"code": "server_error", "message": message},
        }
        failed = {
            "type": "response.failed",
            "sequence_number": self.sequence + 2,
            "response": response,
        }
        return _event("error", error) + _event("response.failed", failed)


def _event(name: str, payload: dict) -> bytes:
    data = json.dumps(payload, ensure_ascii=False, separators=(",", ":"))
    return f"event: {name}\ndata: {data}\n\n".encode()


def _json_line(payload: dict) -> bytes:
    return json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode() + b"\n"
