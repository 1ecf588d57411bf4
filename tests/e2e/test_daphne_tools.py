"""Tool calling through the OpenAI SDK against the real server (Daphne, SmolLM2)."""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import pytest

from tests.e2e.daphne_server import running_server
from tests.wire.openai_chat.test_tools import ASK, SCHEMAS, TOOLS

MODEL = "smollm2-135m-instruct"

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def sdk(tmp_path_factory, smollm2_path):
    openai = pytest.importorskip("openai")
    with running_server(tmp_path_factory.mktemp("pantheon-tools"), {MODEL: smollm2_path}) as srv:
        yield openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=300)


def validate(name: str, arguments: str) -> None:
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])


def test_required_calls_through_the_sdk_are_valid_streamed_and_not(sdk):
    """Twenty-four sampled calls, eight at a time (the server batches them; a seed's tokens
    do not depend on what else runs); the in-process tests sample many more
    (tests/wire/openai_chat/test_tools.py, tests/engine/decoding/test_grammar_on_the_model.py)."""

    def plain(seed: int) -> None:
        completion = sdk.chat.completions.create(
            model=MODEL,
            messages=ASK,
            tools=TOOLS,
            tool_choice="required",
            temperature=1.0,
            seed=seed,
            max_tokens=160,
        )
        choice = completion.choices[0]
        assert choice.finish_reason == "tool_calls"
        [call] = choice.message.tool_calls
        validate(call.function.name, call.function.arguments)
        assert not choice.message.content

    def streamed(seed: int) -> None:
        stream = sdk.chat.completions.create(
            model=MODEL,
            messages=ASK,
            tools=TOOLS,
            tool_choice="required",
            temperature=1.0,
            seed=seed,
            max_tokens=160,
            stream=True,
        )
        name, arguments, content, finish = None, "", "", None
        for chunk in stream:
            for choice in chunk.choices:
                content += choice.delta.content or ""
                for tc in choice.delta.tool_calls or []:
                    if tc.id:
                        assert name is None
                        name = tc.function.name
                    arguments += tc.function.arguments or ""
                finish = choice.finish_reason or finish
        assert finish == "tool_calls" and "<tool_call>" not in content
        validate(name, arguments)

    with ThreadPoolExecutor(8) as pool:
        runs = [pool.submit(plain, seed) for seed in range(12)]
        runs += [pool.submit(streamed, seed) for seed in range(12, 24)]
        for run in runs:
            run.result()  # re-raises a failed case's assertion


def test_an_agent_loop_through_the_sdk(sdk):
    first = sdk.chat.completions.create(
        model=MODEL,
        messages=ASK,
        tools=TOOLS,
        tool_choice="required",
        temperature=0,
        max_tokens=160,
        extra_body={"session_id": "agent-loop"},
    )
    call = first.choices[0].message.tool_calls[0]
    history = [
        *ASK,
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temperature_c": 31}'},
    ]
    final = sdk.chat.completions.create(
        model=MODEL,
        messages=history,
        tools=TOOLS,
        temperature=0,
        max_tokens=48,
        extra_body={"session_id": "agent-loop"},
    )
    assert final.usage.prompt_tokens_details.cached_tokens > 0
    assert final.choices[0].finish_reason in ("stop", "length", "tool_calls")
