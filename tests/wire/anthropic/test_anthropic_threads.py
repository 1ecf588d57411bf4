"""Message threads through the unmodified `anthropic` SDK, in process (its httpx2 ASGI
transport into Django's ASGI app, on the real SmolLM2): the server keeps no threads and
refuses `thread` with `error.details.error_code` `thread_unsupported_request`, so the
SDK's tool runner (threads on by default) falls back to sending the whole conversation
and its second turn has the history and the tools (issue 35 item 1)."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.anyio

MODEL = "smollm2-135m-instruct"
ASK = [{"role": "user", "content": "What's the weather in Paris? Use a tool."}]


def sdk_client(seen: list[dict]):
    """AsyncAnthropic over the ASGI app; `seen` collects each /v1/messages body sent."""
    anthropic = pytest.importorskip("anthropic")
    import httpx2
    from django.core.asgi import get_asgi_application

    async def record(request):
        if request.url.path == "/v1/messages":
            seen.append(json.loads(request.content))

    http = httpx2.AsyncClient(
        transport=httpx2.ASGITransport(app=get_asgi_application()),
        base_url="http://localhost",
        event_hooks={"request": [record]},
    )
    return anthropic.AsyncAnthropic(
        base_url="http://localhost", api_key="x", http_client=http, max_retries=0
    )


async def test_the_tool_runner_falls_back_to_the_whole_conversation(served):
    from anthropic import beta_async_tool

    calls: list[str] = []

    @beta_async_tool
    async def get_weather(city: str) -> str:
        """Current weather for a city.

        Args:
            city: the city's name.
        """
        calls.append(city)
        return "Sunny, 21 C"

    seen: list[dict] = []
    client = sdk_client(seen)
    runner = client.beta.messages.tool_runner(
        model=MODEL,
        max_tokens=48,
        messages=ASK,
        tools=[get_weather],
        tool_choice={"type": "any"},  # a tool call on every turn, whatever the model says
        max_iterations=2,
        extra_body={"temperature": 0},
    )
    replies = [message async for message in runner]
    assert len(replies) == 2 and all(m.stop_reason == "tool_use" for m in replies)
    assert len(calls) == 2  # both turns' calls ran
    # Turn 1 asked for a thread and was refused; the SDK sent it again without one, and
    # turn 2 (unthreaded) carries the whole conversation and the tools.
    assert [("thread" in body) for body in seen] == [True, False, False]
    second = seen[-1]
    assert [m["role"] for m in second["messages"]] == ["user", "assistant", "user"]
    assert second["messages"][2]["content"][0]["type"] == "tool_result"
    assert [tool["name"] for tool in second["tools"]] == ["get_weather"]


async def test_a_thread_is_refused_with_the_code_the_sdk_maps(served):
    import anthropic

    client = sdk_client([])
    for thread in ({"type": "create"}, {"type": "continue", "previous_message_id": "msg_1"}):
        with pytest.raises(anthropic.BadRequestError) as refused:
            await client.beta.messages.create(
                model=MODEL, max_tokens=8, messages=ASK, extra_body={"thread": thread}
            )
        error = refused.value.body["error"]
        assert error["type"] == "invalid_request_error"
        assert error["details"] == {"error_code": "thread_unsupported_request"}
        assert type(refused.value).__name__ == "ThreadUnsupportedRequestError"
