"""Context overflow by policy through the unmodified OpenAI SDK against the real server
(Daphne in a subprocess, the shipped SmolLM2 with a 512-token window): Responses'
truncation="auto" and the chat route's `truncation` extension drop the oldest turns and
say how many in usage; "disabled" (the default) still refuses."""

from __future__ import annotations

import pytest

from tests.e2e.daphne_server import running_server

MODEL = "smollm2-135m-instruct"
WINDOW = 512

pytestmark = pytest.mark.timeout(600)


def long_history(turns: int = 10) -> list[dict]:
    out = []
    for i in range(turns):
        out.append({"role": "user", "content": f"Tell me fact {i}. " + "Please. " * 20})
        out.append({"role": "assistant", "content": f"Fact {i}: " + "water is wet. " * 10})
    out.append({"role": "user", "content": "What is the capital of France?"})
    return out


@pytest.fixture(scope="module")
def sdk(tmp_path_factory, smollm2_path):
    openai = pytest.importorskip("openai")
    with running_server(
        tmp_path_factory.mktemp("pantheon-truncation"),
        {MODEL: smollm2_path},
        PANTHEON_CTX_CAP=str(WINDOW),
    ) as srv:
        yield openai.OpenAI(base_url=srv.url + "/v1", api_key="x", max_retries=0, timeout=300)


def test_responses_truncation_auto_drops_the_oldest_turns(sdk):
    response = sdk.responses.create(
        model=MODEL,
        instructions="Answer briefly.",
        input=long_history(),
        truncation="auto",
        max_output_tokens=16,
        temperature=0,
        store=False,
    )
    assert response.status in ("completed", "incomplete")
    assert response.truncation == "auto"
    dropped = response.usage.model_extra["truncated_messages"]
    assert dropped > 0 and dropped % 2 == 0
    assert response.usage.input_tokens <= WINDOW - 16
    assert response.output_text


def test_responses_truncation_disabled_still_refuses(sdk):
    import openai

    with pytest.raises(openai.APIStatusError) as refused:
        sdk.responses.create(model=MODEL, input=long_history(), max_output_tokens=16, store=False)
    assert refused.value.status_code in (400, 422)
    assert "maximum context length" in refused.value.message


def test_chat_truncation_extension(sdk):
    completion = sdk.chat.completions.create(
        model=MODEL,
        messages=[{"role": "system", "content": "Answer briefly."}, *long_history()],
        max_tokens=16,
        temperature=0,
        extra_body={"truncation": "auto"},
    )
    assert completion.usage.model_extra["truncated_messages"] > 0
    assert completion.usage.prompt_tokens <= WINDOW - 16
    short = sdk.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        extra_body={"truncation": "auto"},
    )
    assert "truncated_messages" not in (short.usage.model_extra or {})
