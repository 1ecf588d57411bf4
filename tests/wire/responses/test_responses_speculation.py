"""The `speculation` extension on POST /v1/responses: checked by the request table (a 400
naming it), handed to the chat core, and the same output either way."""

from __future__ import annotations

import json

import pytest
from django.test import AsyncClient

from pantheon_platform.errors import ApiError
from wire.responses.request import parse_request

ASK = "Repeat after me: one two three four five six seven eight."


@pytest.mark.parametrize("value", [None, "auto", "off"])
def test_speculation_is_read(value):
    assert parse_request({"input": ASK, "speculation": value}).speculation == value


@pytest.mark.parametrize("value", ["fast", "", "AUTO", True, 1, ["off"], {"mode": "off"}])
def test_a_bad_speculation_is_a_400_naming_it(value):
    with pytest.raises(ApiError) as refused:
        parse_request({"input": ASK, "speculation": value})
    error = refused.value.body()["error"]
    assert refused.value.status == 400 and error["param"] == "speculation"
    assert error["message"] == 'speculation: expected "auto" or "off"'


def test_the_schema_lists_it():
    from pantheon_site import openapi

    request = openapi.document()["components"]["schemas"]["ResponsesRequest"]
    assert request["properties"]["speculation"]["anyOf"][0]["enum"] == ["auto", "off"]


@pytest.mark.anyio
@pytest.mark.django_db(transaction=True)
async def test_the_output_is_the_same_with_speculation_on_or_off(served):
    client = AsyncClient(enforce_csrf_checks=True)
    outputs = {}
    for mode in ("auto", "off"):
        body = {
            "input": ASK,
            "temperature": 0,
            "max_output_tokens": 16,
            "store": False,
            "speculation": mode,
        }
        response = await client.post(
            "/v1/responses", data=json.dumps(body), content_type="application/json"
        )
        assert response.status_code == 200, response.content
        answer = response.json()
        outputs[mode] = (answer["output"][-1]["content"][0]["text"], answer["usage"])
    assert outputs["auto"] == outputs["off"] and outputs["off"][0]
