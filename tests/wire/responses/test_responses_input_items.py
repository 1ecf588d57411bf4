"""GET /v1/responses/{id}/input_items through the unmodified OpenAI SDK
(`client.responses.input_items.list`, in process: httpx's ASGI transport into the
server's ASGI stack, on the real SmolLM2): the stored conversation before the output as
OpenAI's items, a continued response's earlier turns included, paged with `after`
(issue 35 item 6)."""

from __future__ import annotations

import pytest

from wire.responses.input_items import items_of, page

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.anyio]

MODEL = "smollm2-135m-instruct"
GREEDY = {"temperature": 0, "max_output_tokens": 8}


@pytest.fixture
def sdk(served):
    openai = pytest.importorskip("openai")
    import httpx
    from django.core.asgi import get_asgi_application

    from access import keys
    from pantheon_site import stack

    keys.forget_cache()
    transport = httpx.ASGITransport(app=stack.build(get_asgi_application()))
    http = httpx.AsyncClient(transport=transport, base_url="http://localhost")
    yield openai.AsyncOpenAI(
        base_url="http://localhost/v1", api_key="x", http_client=http, max_retries=0
    )
    keys.forget_cache()


async def test_the_sdk_lists_a_responses_input_items(sdk):
    import openai

    first = await sdk.responses.create(
        model=MODEL, input="What is the capital of France?", instructions="Be brief.", **GREEDY
    )
    items = await sdk.responses.input_items.list(first.id)
    assert [(i.type, i.role, i.content[0].text) for i in items.data] == [
        ("message", "user", "What is the capital of France?")
    ]
    assert items.data[0].content[0].type == "input_text"

    second = await sdk.responses.create(
        model=MODEL, input="And of Italy?", previous_response_id=first.id, **GREEDY
    )
    newest_first = await sdk.responses.input_items.list(second.id)
    said = first.output_text
    assert [(i.role, i.content[0].text) for i in newest_first.data] == [
        ("user", "And of Italy?"),
        ("assistant", said),
        ("user", "What is the capital of France?"),
    ]
    assert newest_first.data[1].content[0].type == "output_text"
    oldest_first = await sdk.responses.input_items.list(second.id, order="asc")
    assert [i.id for i in oldest_first.data] == [i.id for i in newest_first.data][::-1]

    # Paged one at a time: the SDK's auto-pagination follows `after` to the end.
    one = await sdk.responses.input_items.list(second.id, limit=1, order="asc")
    assert one.has_more and one.first_id == one.last_id == oldest_first.data[0].id
    walked = [item.id async for item in sdk.responses.input_items.list(second.id, limit=1)]
    assert walked == [i.id for i in newest_first.data]

    with pytest.raises(openai.NotFoundError):
        await sdk.responses.input_items.list("resp_" + "0" * 48)
    with pytest.raises(openai.BadRequestError):
        await sdk.responses.input_items.list(second.id, limit=0)


def test_calls_and_their_outputs_are_their_own_items():
    conversation = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "Sunny"},
        {"role": "assistant", "content": "It is sunny."},  # the response's own output
    ]
    items = items_of("resp_ab", conversation)
    assert [item["type"] for item in items] == ["message", "function_call", "function_call_output"]
    assert items[1]["call_id"] == items[2]["call_id"] == "call_1"
    assert items[1]["arguments"] == '{"city": "Paris"}' and items[2]["output"] == "Sunny"
    assert len({item["id"] for item in items}) == 3
    listed = page(items, {"order": "asc", "after": items[0]["id"], "limit": "1"})
    assert [i["id"] for i in listed["data"]] == [items[1]["id"]] and listed["has_more"]
