"""The OpenAI Python SDK against the in-process app (the whole ASGI stack, its real
access guard), for the Files and Batches tests; console keys as the console makes them."""

from __future__ import annotations

import httpx
import pytest

from tests.access.helpers import console_key, in_db


@pytest.fixture
def app(served):
    from django.core.asgi import get_asgi_application

    from access import keys
    from pantheon_site import stack

    keys.forget_cache()
    yield stack.build(get_asgi_application())
    keys.forget_cache()


@pytest.fixture
def files_dir(settings, tmp_path):
    settings.PANTHEON_FILES_DIR = tmp_path / "files"
    return settings.PANTHEON_FILES_DIR


def sdk(app, key: str):
    """An unmodified openai.AsyncOpenAI whose HTTP goes to `app` in-process."""
    import openai

    transport = httpx.ASGITransport(app=app)
    return openai.AsyncOpenAI(
        api_key=key,
        base_url="http://127.0.0.1:8000/v1",
        http_client=httpx.AsyncClient(transport=transport, timeout=300),
        max_retries=0,
    )


async def new_key(name: str) -> str:
    return await in_db(console_key, name, ["inference"])
