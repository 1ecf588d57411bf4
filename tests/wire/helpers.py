"""Helpers for driving the Django app in-process: SSE parsing and raw ASGI calls."""

from __future__ import annotations

import asyncio
import json

from tests.support import asgi_scope

CHAT = "/v1/chat/completions"
HELLO = [{"role": "user", "content": "What is the capital of France?"}]


def sse_events(raw: bytes) -> list:
    """`data:` payloads of an SSE body, JSON-decoded; the `[DONE]` sentinel stays a string."""
    events = []
    for block in raw.decode().split("\n\n"):
        if not block.strip():
            continue
        assert block.startswith("data: "), block
        data = block[len("data: ") :]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


async def read_stream(response) -> list:
    return sse_events(b"".join([chunk async for chunk in response.streaming_content]))


class AsgiCall:
    """One request driven through Django's real ASGI handler, with a client that can hang
    up: the path a server takes, including the disconnect that cancels the response."""

    def __init__(self, app, path: str, body: bytes, method: str = "POST"):
        self.scope = asgi_scope(method, path)
        self.app = app
        self.body = body
        self.status: int | None = None
        self.headers: dict[bytes, bytes] = {}
        self.chunks: list[bytes] = []
        self.got_chunk = asyncio.Event()
        self.hang_up = asyncio.Event()
        self._body_sent = False
        self.task: asyncio.Task | None = None
        # A slow client: once set, send() blocks (a full socket buffer) until hang-up.
        self.stall = False

    async def _receive(self):
        if not self._body_sent:
            self._body_sent = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await self.hang_up.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message):
        if message["type"] == "http.response.start":
            self.status = message["status"]
            self.headers = dict(message["headers"])
        elif message.get("body"):
            self.chunks.append(message["body"])
            self.got_chunk.set()
        if self.stall:
            await self.hang_up.wait()
            await asyncio.Event().wait()  # the server cancels us once it sees the disconnect

    def start(self) -> AsgiCall:
        self.task = asyncio.create_task(self.app(self.scope, self._receive, self._send))
        return self

    async def wait_for(self, predicate, timeout: float) -> None:
        async def poll():
            while not predicate(self):
                self.got_chunk.clear()
                await self.got_chunk.wait()

        await asyncio.wait_for(poll(), timeout)


# A think-style chat template for SmolLM2 (the `thinker` fixture serves it).
THINK_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n"
    "{% if enable_thinking is defined and not enable_thinking %}<think>\n\n</think>\n\n"
    "{% endif %}{% endif %}"
)
