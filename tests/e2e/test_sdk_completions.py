"""Legacy completions, embeddings and llama.cpp's tokenize routes through the unmodified
`openai` SDK (and httpx) against the real server: Daphne serving the shipped SmolLM2,
with an API key (the routes take the `inference` scope and log as the chat route)."""

from __future__ import annotations

import json
import time

import httpx
import numpy as np
import pytest

from pantheon_platform import routes
from tests.e2e.daphne_server import running_server
from tests.engine.serving.test_embedding import PARAPHRASES, UNRELATED

MODEL = "smollm2-135m-instruct"
KEY = "sk-completions-e2e"
ADMIN_KEY = "sk-completions-e2e-admin"
AUTH = {"Authorization": f"Bearer {KEY}"}
ROUTES = ("/v1/completions", "/v1/embeddings", "/tokenize", "/detokenize")
QUESTION = "What is the capital of France?"
# SmolLM2's chat template (ChatML) for a system and a user turn, written out by hand: the
# raw prompt a legacy completion sends to get the chat route's answer.
CHATML = (
    "<|im_start|>system\nBe brief.<|im_end|>\n"
    f"<|im_start|>user\n{QUESTION}<|im_end|>\n"
    "<|im_start|>assistant\n"
)

pytestmark = pytest.mark.timeout(900)


@pytest.fixture(scope="module")
def server(tmp_path_factory, smollm2_path):
    with running_server(
        tmp_path_factory.mktemp("pantheon-completions"),
        {MODEL: smollm2_path},
        PANTHEON_API_KEY=KEY,
        PANTHEON_ADMIN_API_KEY=ADMIN_KEY,
    ) as srv:
        yield srv


@pytest.fixture(scope="module")
def sdk(server):
    openai = pytest.importorskip("openai")
    return openai.OpenAI(base_url=server.url + "/v1", api_key=KEY, max_retries=0, timeout=300)


# --- /v1/completions -------------------------------------------------------------------


def test_a_greedy_raw_prompt_completes_as_the_chat_route_answers(sdk):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": QUESTION}]
    chat = sdk.chat.completions.create(model=MODEL, messages=messages, temperature=0, max_tokens=32)
    plain = sdk.completions.create(model=MODEL, prompt=CHATML, temperature=0, max_tokens=32)
    assert plain.object == "text_completion"
    (choice,) = plain.choices
    assert choice.text == chat.choices[0].message.content
    assert choice.text and choice.finish_reason == chat.choices[0].finish_reason == "stop"
    assert plain.usage.prompt_tokens == chat.usage.prompt_tokens
    assert plain.usage.completion_tokens == chat.usage.completion_tokens


def test_streamed_equals_plain(sdk):
    kwargs = dict(model=MODEL, prompt="Once upon a time", temperature=0, max_tokens=20)
    plain = sdk.completions.create(**kwargs)
    assert plain.choices[0].finish_reason == "length"
    assert plain.usage.completion_tokens == 20
    texts, finish, usage = [], None, None
    for chunk in sdk.completions.create(
        **kwargs, stream=True, stream_options={"include_usage": True}
    ):
        assert chunk.object == "text_completion"
        usage = chunk.usage or usage
        for c in chunk.choices:
            texts.append(c.text)
            finish = c.finish_reason or finish
    assert len(texts) > 5
    assert "".join(texts) == plain.choices[0].text
    assert finish == "length" and usage.completion_tokens == 20


def test_echo_with_logprobs_scores_the_prompt_and_the_answer(sdk):
    prompt = "The capital of France is"
    answer = sdk.completions.create(
        model=MODEL, prompt=prompt, echo=True, logprobs=3, temperature=0, max_tokens=4
    )
    (choice,) = answer.choices
    assert choice.text.startswith(prompt) and len(choice.text) > len(prompt)
    lp = choice.logprobs
    n = len(lp.tokens)
    assert len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n
    assert n == answer.usage.prompt_tokens + answer.usage.completion_tokens
    assert "".join(lp.tokens) == choice.text
    assert lp.token_logprobs[0] is None  # nothing before the first token (no BOS here)
    assert all(x <= 0 for x in lp.token_logprobs[1:])
    assert lp.text_offset == [sum(len(t) for t in lp.tokens[:i]) for i in range(n)]
    # Greedy: each generated token is its position's most likely one.
    for token, logprob, top in list(
        zip(lp.tokens, lp.token_logprobs, lp.top_logprobs, strict=True)
    )[-4:]:
        assert len(top) == 3
        assert max(top.values()) == pytest.approx(logprob, abs=1e-4) and token in top
    # Streamed: the echo chunk carries the prompt's logprobs, then each token's.
    tokens = []
    for chunk in sdk.completions.create(
        model=MODEL, prompt=prompt, echo=True, logprobs=3, temperature=0, max_tokens=4, stream=True
    ):
        for c in chunk.choices:
            if c.logprobs is not None:
                tokens += c.logprobs.tokens
    assert tokens == lp.tokens


def test_token_prompts_and_several_prompts(sdk, server):
    def ids(text):
        response = httpx.post(server.url + "/tokenize", json={"content": text}, headers=AUTH)
        return response.json()["tokens"]

    by_text = sdk.completions.create(
        model=MODEL, prompt="Once upon a time", temperature=0, max_tokens=8
    )
    once = ids("Once upon a time")
    by_ids = sdk.completions.create(model=MODEL, prompt=once, temperature=0, max_tokens=8)
    assert by_ids.choices[0].text == by_text.choices[0].text
    several = sdk.completions.create(
        model=MODEL, prompt=[once, ids("One, two,")], n=2, temperature=0, max_tokens=8
    )
    assert [c.index for c in several.choices] == [0, 1, 2, 3]
    assert several.choices[0].text == several.choices[1].text == by_text.choices[0].text
    assert several.choices[2].text != several.choices[0].text
    strings = sdk.completions.create(
        model=MODEL, prompt=["Once upon a time", "One, two,"], temperature=0, max_tokens=8
    )
    assert [c.text for c in strings.choices] == [several.choices[0].text, several.choices[2].text]


def test_several_prompts_streamed_are_their_plain_answers(sdk):
    kwargs = dict(
        model=MODEL, prompt=["Once upon a time", "One, two,"], n=2, temperature=0, max_tokens=12
    )
    plain = sdk.completions.create(**kwargs)
    texts: dict[int, str] = {}
    finishes: dict[int, str] = {}
    for chunk in sdk.completions.create(**kwargs, stream=True):
        for c in chunk.choices:
            texts[c.index] = texts.get(c.index, "") + c.text
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
    assert texts == {c.index: c.text for c in plain.choices}
    assert finishes == {c.index: c.finish_reason for c in plain.choices}
    assert sorted(texts) == [0, 1, 2, 3]


def test_stop_ends_the_text_before_the_stop_string(sdk):
    plain = sdk.completions.create(model=MODEL, prompt="1, 2, 3,", temperature=0, max_tokens=16)
    text = plain.choices[0].text
    assert " 5" in text, text
    stopped = sdk.completions.create(
        model=MODEL, prompt="1, 2, 3,", temperature=0, max_tokens=16, stop=[" 5"]
    )
    assert stopped.choices[0].text == text[: text.index(" 5")]
    assert stopped.choices[0].finish_reason == "stop"


@pytest.mark.parametrize(
    "kwargs, param",
    [
        ({"suffix": "and then"}, "suffix"),
        ({"best_of": 3}, "best_of"),
        ({"logprobs": 99}, "logprobs"),
        ({"prompt": [[1, 2], "x"]}, "prompt"),
    ],
)
def test_completion_refusals_are_400s_in_the_openai_shape(sdk, kwargs, param):
    import openai

    with pytest.raises(openai.BadRequestError) as caught:
        sdk.completions.create(**{"model": MODEL, "prompt": "Hi", "max_tokens": 2, **kwargs})
    assert caught.value.status_code == 400
    assert caught.value.body["param"] == param and caught.value.body["message"]


# --- /v1/embeddings ---------------------------------------------------------------------


def test_embeddings_single_batch_and_both_encodings(sdk):
    texts = ["The cat sleeps.", "Quarterly revenue grew.", "A dog barks loudly at night."]
    # The SDK asks for base64 by default and decodes it itself.
    batch = sdk.embeddings.create(model=MODEL, input=texts)
    floats = sdk.embeddings.create(model=MODEL, input=texts, encoding_format="float")
    assert [d.index for d in batch.data] == [0, 1, 2]
    assert batch.usage.prompt_tokens == batch.usage.total_tokens > 0
    for a, b in zip(batch.data, floats.data, strict=True):
        assert a.embedding == b.embedding
        assert len(a.embedding) == 576
        assert np.linalg.norm(a.embedding) == pytest.approx(1.0, abs=1e-5)
    # The same bits alone as in the batch.
    for i, text in enumerate(texts):
        alone = sdk.embeddings.create(model=MODEL, input=text, encoding_format="float")
        assert alone.data[0].embedding == floats.data[i].embedding
    ids = sdk.embeddings.create(model=MODEL, input=[[504, 2644, 30], [504]])
    assert [len(d.embedding) for d in ids.data] == [576, 576]


def test_paraphrases_embed_closer_than_unrelated_pairs(sdk):
    texts = sorted({t for pair in PARAPHRASES + UNRELATED for t in pair})
    data = sdk.embeddings.create(model=MODEL, input=texts).data
    vectors = {t: np.asarray(d.embedding) for t, d in zip(texts, data, strict=True)}
    para = np.mean([vectors[a] @ vectors[b] for a, b in PARAPHRASES])
    unrelated = np.mean([vectors[a] @ vectors[b] for a, b in UNRELATED])
    print(f"paraphrases {para:.4f}, unrelated {unrelated:.4f}")
    assert para > unrelated


@pytest.mark.parametrize(
    "kwargs, param",
    [({"dimensions": 64}, "dimensions"), ({"input": ""}, "input"), ({"input": [[]]}, "input")],
)
def test_embedding_refusals_are_400s(sdk, kwargs, param):
    import openai

    with pytest.raises(openai.BadRequestError) as caught:
        sdk.embeddings.create(**{"model": MODEL, "input": "Hi", **kwargs})
    assert caught.value.body["param"] == param


# --- /tokenize, /detokenize ------------------------------------------------------------


def test_tokenize_round_trip_over_daphne(server):
    text = "Hello, wörld! <|im_end|>"
    tokens = httpx.post(server.url + "/tokenize", json={"content": text}, headers=AUTH)
    tokens = tokens.json()["tokens"]
    assert tokens[-1] == 2  # the special token written in the text is recognised
    back = httpx.post(
        server.url + "/detokenize", json={"tokens": tokens, "model": MODEL}, headers=AUTH
    )
    assert back.json() == {"content": text}
    bad = httpx.post(server.url + "/detokenize", json={"tokens": [-1]}, headers=AUTH)
    assert bad.status_code == 400 and bad.json()["error"]["param"] == "tokens"


# --- keys, limits, the access log ---------------------------------------------------


def test_the_routes_take_the_inference_scope_the_large_body_limit_and_log_the_model(server):
    body = {"prompt": "Hi", "max_tokens": 1, "input": "Hi", "content": "Hi", "tokens": [1]}
    for path in ROUTES:
        assert routes.scope_for(path) == routes.INFERENCE
        assert routes.body_limit(path) == routes.body_limit("/v1/chat/completions")
        refused = httpx.post(server.url + path, json=body, timeout=30)
        assert refused.status_code == 401 and refused.json()["error"]["type"] == "invalid_api_key"
        assert httpx.post(server.url + path, json=body, headers=AUTH, timeout=300).is_success
    deadline = time.monotonic() + 10
    logged: dict[str, dict] = {}
    while time.monotonic() < deadline and len(logged) < len(ROUTES):
        for line in server.log.read_text(errors="replace").splitlines():
            start = line.find('{"ts"')
            entry = json.loads(line[start:]) if start >= 0 else {}
            if entry.get("route") in ROUTES and entry.get("status") == 200:
                logged[entry["route"]] = entry
        time.sleep(0.2)
    assert set(logged) == set(ROUTES)
    assert all(
        entry["model"] == MODEL and entry["key"] == "env:client" for entry in logged.values()
    )


def in_flight(server) -> int:
    rows = httpx.get(
        server.url + "/admin/models", headers={"Authorization": f"Bearer {ADMIN_KEY}"}
    ).json()["data"]
    return sum(row["in_flight"] for row in rows)


def test_a_client_that_hangs_up_mid_stream_stops_its_generations(server):
    """Two prompts, each asking for the whole window, generating side by side: the client
    reads a few chunks and leaves. Both engine streams are closed, so nothing is left
    generating."""
    body = {"prompt": ["Count: 1, 2, 3,", "Count: 4, 5,"], "max_tokens": 100_000, "stream": True}
    with httpx.stream(
        "POST", server.url + "/v1/completions", json=body, headers=AUTH, timeout=120
    ) as response:
        assert response.status_code == 200
        lines = response.iter_lines()
        texts = 0
        while texts < 3:
            texts += '"text"' in next(lines)
        assert in_flight(server) == 2
    deadline = time.monotonic() + 30  # generating the window would take minutes
    while in_flight(server) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert in_flight(server) == 0
