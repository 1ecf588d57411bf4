"""Server-sent events for streamed completions."""

from __future__ import annotations

import json
from collections.abc import AsyncGenerator

from django.http import StreamingHttpResponse

DONE = b"data: [DONE]\n\n"


def sse_data(payload: dict) -> bytes:
    """One `data:` event. Compact JSON: a streamed answer is one event per token."""
    return (
        b"data: "
        + json.dumps(payload, ensure_ascii=False, separators=(",", ":")).encode()
        + b"\n\n"
    )


class EventStreamResponse(StreamingHttpResponse):
    """text/event-stream fed by an async generator of encoded events.

    It must be an async generator: under Daphne a sync iterator is consumed whole before
    the first byte goes out. Each event is sent as it is produced.
    """

    def __init__(self, events: AsyncGenerator[bytes, None]):
        super().__init__(events, content_type="text/event-stream")
        self["Cache-Control"] = "no-cache"
        self["X-Accel-Buffering"] = "no"  # nginx would otherwise buffer the stream

    def __aiter__(self):
        # Django's ASGI handler sends `aiter(response)` inside `aclosing(...)`. The stock
        # __aiter__ wraps our generator twice more, and closing those wrappers leaves ours
        # suspended until garbage collection. Handing out our generator itself lets the
        # handler's aclose() reach it at once (client disconnects included), so its
        # `finally` closes the engine stream and the generation stops.
        return self._iterator
