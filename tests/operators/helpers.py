"""Helpers for the operator tests (imported as tests.operators.helpers; not a conftest, so
that test modules elsewhere never pick it up by accident)."""

from __future__ import annotations

import asyncio
import json

from django.test import Client

from engine.serving.records import EngineStats
from engine.types import ModelConfig
from tests.support import asgi_scope


class FakeService:
    """Stands in for a loaded ModelService where only bookkeeping matters: a test sets
    `in_flight` to play a running generation."""

    def __init__(self, name: str = "fake", *, in_flight: int = 0, memory_bytes: int = 1000):
        self.name = name
        self.in_flight = in_flight
        self.memory_bytes = memory_bytes
        self.closed = False
        self.path = f"/models/{name}.gguf"
        self.architecture = "llama"
        self.quantization = "F32"
        self.load_seconds = 0.0
        self.weight_cache_used = False
        self.weights_version = "0" * 16
        self.created = 0
        self.on_accelerator = False
        self.kernel, self.kernel_isa, self.kernel_fallback = "numpy", None, {}
        self.kernel_activations = None
        self.pooling = "mean"
        self.kv_dtype, self.kv_bytes_per_token = "f32", 0
        self.max_sessions = 4
        self.max_concurrent = 1
        self.max_concurrent_configured = 4
        self.context_window = 256
        self.dies: list[int] = []
        self.attention = None
        self.graphs = None
        self.config = ModelConfig(name=name, path=self.path)
        self.stats = EngineStats()  # the speculation counters the row reads
        self.draft = None  # no draft model

    def close(self) -> None:
        self.closed = True


class Api:
    """JSON calls to the in-process app, as a real client makes them (no CSRF token)."""

    def __init__(self):
        self.client = Client(enforce_csrf_checks=True)

    def get(self, path: str):
        return self.client.get(path)

    def post(self, path: str, body=None):
        data = body if isinstance(body, bytes | str) else json.dumps(body or {})
        return self.client.post(path, data=data, content_type="application/json")

    def delete(self, path: str):
        return self.client.delete(path)


def error_of(response, status: int, type_: str) -> str:
    """The error message, after checking the status and the contract's error shape."""
    assert response.status_code == status, response.content
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert error["type"] == type_ and error["code"] is None and error["message"], error
    assert "Traceback" not in response.content.decode()
    return error["message"]


def install(monkeypatch, runtime) -> None:
    """Serve both the client routes and the operator routes from `runtime`."""
    from tests.conftest import use_runtime

    use_runtime(monkeypatch, runtime)


class AsgiRequest:
    """One request through Django's real ASGI handler, the way Daphne drives it (a sync
    view gets its own thread), with the response body collected as it is sent."""

    def __init__(self, app, method: str, path: str, body: bytes = b""):
        self.app = app
        self.scope = asgi_scope(method, path)
        self.body = body
        self.status: int | None = None
        self.chunks: list[bytes] = []
        self.task: asyncio.Task | None = None
        self._sent_body = False
        self._progress = asyncio.Event()

    def start(self) -> AsgiRequest:
        self.task = asyncio.create_task(self.app(self.scope, self._receive, self._send))
        return self

    async def _receive(self):
        if not self._sent_body:
            self._sent_body = True
            return {"type": "http.request", "body": self.body, "more_body": False}
        await asyncio.Event().wait()  # this client never hangs up

    async def _send(self, message):
        if message["type"] == "http.response.start":
            self.status = message["status"]
        elif message.get("body"):
            self.chunks.append(message["body"])
        self._progress.set()

    async def wait_for(self, predicate, timeout: float) -> None:
        async def poll():
            while not predicate(self):
                self._progress.clear()
                await self._progress.wait()

        await asyncio.wait_for(poll(), timeout)

    def json(self):
        return json.loads(b"".join(self.chunks))
