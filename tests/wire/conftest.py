"""Fixtures for driving the Django app in-process: the async test client and raw ASGI."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from django.test import AsyncClient

from tests.wire.helpers import CHAT, THINK_TEMPLATE


@pytest.fixture
def client() -> AsyncClient:
    return AsyncClient(enforce_csrf_checks=True)  # as a real client: no CSRF token


@pytest.fixture
def post_chat(client):
    """POST a body (dict -> JSON; bytes/str sent as is) to /v1/chat/completions."""

    async def post(body, content_type="application/json"):
        data = body if isinstance(body, bytes | str) else json.dumps(body)
        return await client.post(CHAT, data=data, content_type=content_type)

    return post


@pytest.fixture
def asgi_app():
    from django.core.asgi import get_asgi_application

    return get_asgi_application()


@pytest.fixture
def thinker(served, smollm2_service):
    """SmolLM2's weights behind a think-style chat template (a second service over the
    same arrays)."""
    from engine.serving.service import ModelService
    from engine.text.chat_template import ChatTemplate

    svc = ModelService(
        replace(smollm2_service.config, name="thinker"),
        smollm2_service.gguf,
        smollm2_service.model,
        smollm2_service.tokenizer,
        ChatTemplate(THINK_TEMPLATE, eos_token="<|im_end|>"),
    )
    served.register("thinker", svc)
    yield svc
    served.unregister("thinker")
    svc.close()


@pytest.fixture
def minicpm_like(served, smollm2_service):
    """SmolLM2's weights behind its own template with `{{ bos_token }}` in front: a llama
    model whose template adds BOS, which the contract serves in the MiniCPM XML dialect."""
    from engine.serving.service import ModelService
    from engine.text.chat_template import ChatTemplate

    base = smollm2_service.template
    svc = ModelService(
        replace(smollm2_service.config, name="minicpm-like"),
        smollm2_service.gguf,
        smollm2_service.model,
        smollm2_service.tokenizer,
        ChatTemplate("{{ bos_token }}" + base.source, base.bos_token, base.eos_token),
    )
    served.register("minicpm-like", svc)
    yield svc
    served.unregister("minicpm-like")
    svc.close()
