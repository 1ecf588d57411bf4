"""LangChain's ChatOpenAI against the real server (Daphne, SmolLM2), unmodified:
`with_structured_output(Schema, method="function_calling")` sends the schema as a tool
and names it in `tool_choice`; the server must compel that call, so the answer parses
into an instance of the schema."""

from __future__ import annotations

from typing import Literal

import pytest

from tests.e2e.daphne_server import running_server

MODEL = "smollm2-135m-instruct"

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def server(tmp_path_factory, smollm2_path):
    pytest.importorskip("langchain_openai")
    with running_server(
        tmp_path_factory.mktemp("pantheon-langchain"), {MODEL: smollm2_path}
    ) as srv:
        yield srv


def chat_model(server, **kwargs):
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(
        model=MODEL,
        base_url=server.url + "/v1",
        api_key="x",
        max_retries=0,
        timeout=300,
        max_tokens=160,
        **kwargs,
    )


def test_structured_output_by_function_calling_parses_an_instance(server):
    from pydantic import BaseModel, Field

    class Weather(BaseModel):
        """The weather asked about: a city and the unit to report it in."""

        city: str = Field(description="the city", max_length=30)
        unit: Literal["c", "f"] = Field(description="c or f")

    for seed in range(3):
        structured = chat_model(server, temperature=1.0, seed=seed).with_structured_output(
            Weather, method="function_calling"
        )
        answer = structured.invoke("What's the weather in Oslo, in celsius?")
        assert isinstance(answer, Weather), answer
        assert answer.unit in ("c", "f") and len(answer.city) <= 30


def test_structured_output_with_the_raw_message_names_the_tool(server):
    from pydantic import BaseModel, Field

    class Person(BaseModel):
        """A person mentioned in the text."""

        name: str = Field(max_length=20)
        age: int = Field(ge=0, le=150)

    structured = chat_model(server, temperature=0).with_structured_output(
        Person, method="function_calling", include_raw=True
    )
    result = structured.invoke("Alice is 31 years old. Who is she?")
    assert result["parsing_error"] is None
    assert isinstance(result["parsed"], Person)
    [call] = result["raw"].tool_calls
    assert call["name"] == "Person" and call["id"].startswith("call_")
    assert result["raw"].response_metadata["finish_reason"] == "tool_calls"
