"""A prompt over the window, as the client libraries see it (in process: httpx's ASGI
transport into Django's ASGI app, on the real SmolLM2): the unmodified OpenAI SDK raises
BadRequestError with `code: "context_length_exceeded"`, LangChain's ChatOpenAI raises
its ContextOverflowError, and the Anthropic routes' "prompt is too long" is
ChatAnthropic's (issue 35 item 2)."""

from __future__ import annotations

import asyncio

import pytest

MODEL = "smollm2-135m-instruct"


def giant(svc) -> str:
    return "hello " * (svc.context_window_configured + 100)


def asgi_http():
    import httpx
    from django.core.asgi import get_asgi_application

    transport = httpx.ASGITransport(app=get_asgi_application())
    return httpx.AsyncClient(transport=transport, base_url="http://localhost")


def test_the_openai_sdk_reads_context_length_exceeded(served, smollm2_service):
    openai = pytest.importorskip("openai")

    async def run():
        async with asgi_http() as http:
            sdk = openai.AsyncOpenAI(
                base_url="http://localhost/v1", api_key="x", http_client=http, max_retries=0
            )
            content = giant(smollm2_service)
            for stream in (False, True):
                with pytest.raises(openai.BadRequestError) as refused:
                    await sdk.chat.completions.create(
                        model=MODEL,
                        messages=[{"role": "user", "content": content}],
                        stream=stream,
                    )
                assert refused.value.status_code == 400
                assert refused.value.code == "context_length_exceeded"
                error = refused.value.body
                assert error["context_window"] == smollm2_service.context_window_configured
                assert error["prompt_tokens"] > error["context_window"]

    asyncio.run(run())


def test_langchain_chatopenai_raises_its_context_overflow_error(served, smollm2_service):
    pytest.importorskip("langchain_openai")
    from langchain_core.exceptions import ContextOverflowError
    from langchain_openai import ChatOpenAI

    async def run():
        async with asgi_http() as http:
            chat = ChatOpenAI(
                model=MODEL,
                base_url="http://localhost/v1",
                api_key="x",
                http_async_client=http,
                max_retries=0,
            )
            with pytest.raises(ContextOverflowError):
                await chat.ainvoke(giant(smollm2_service))

    asyncio.run(run())


def test_langchain_chatanthropic_raises_its_context_overflow_error(served, smollm2_service):
    pytest.importorskip("langchain_anthropic")
    import httpx2
    from django.core.asgi import get_asgi_application
    from langchain_anthropic import ChatAnthropic
    from langchain_core.exceptions import ContextOverflowError

    async def run():
        transport = httpx2.ASGITransport(app=get_asgi_application())
        async with httpx2.AsyncClient(transport=transport, base_url="http://localhost") as http:
            chat = ChatAnthropic(
                model=MODEL, base_url="http://localhost", api_key="x", max_retries=0
            )
            chat._async_client._client = http  # the SDK's own client, over the ASGI app
            with pytest.raises(ContextOverflowError):
                await chat.ainvoke(giant(smollm2_service))

    asyncio.run(run())
