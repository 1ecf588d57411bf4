"""A lone UTF-16 surrogate anywhere in a JSON body is a 400 naming where (issue 18, defect
6): JSON may spell one (`"x\\ud800y"`), Python keeps it in the str, and the tokenizer (or
any encoder after it) cannot take it; before, the chat route answered 500.

The check is central: `wire.openai_chat.request.parse_json_object`, the one parser of every
JSON route, walks the parsed document and names the first string (value or key) holding
one, in the error's `param` and message. Property tests inject one surrogate into every
text field of a chat request, of the session routes and of an operator route.
"""

from __future__ import annotations

import json

import pytest
from django.test import Client
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from pantheon_platform.strict_json import lone_surrogate_at

pytestmark = pytest.mark.django_db

TEXT = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=12)
SURROGATE = st.integers(0xD800, 0xDFFF).map(chr)


def chat_body(text: st.DataObject) -> dict:
    """A chat request with every text field the route reads (and some it ignores)."""
    t = lambda: text.draw(TEXT)  # noqa: E731
    return {
        "model": t(),
        "messages": [
            {"role": "system", "content": t(), "name": t()},
            {
                "role": "user",
                "content": [{"type": "text", "text": t()}, {"type": "text", "text": t()}],
            },
            {
                "role": "assistant",
                "content": t(),
                "reasoning_content": t(),
                "tool_calls": [
                    {
                        "id": t(),
                        "type": "function",
                        "function": {"name": t(), "arguments": t()},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": t(), "name": t(), "content": t()},
        ],
        "stop": [t(), t()],
        "session_id": t(),
        "prompt_cache_key": t(),
        "promptCacheKey": t(),
        "tools": [
            {
                "type": "function",
                "function": {
                    "name": t(),
                    "description": t(),
                    "parameters": {
                        "type": "object",
                        "properties": {"city": {"type": "string", "description": t()}},
                    },
                },
            }
        ],
        "tool_choice": {"type": "function", "function": {"name": t()}},
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": t(), "schema": {"type": "string", "pattern": t()}},
        },
        "logit_bias": {t(): 1},
        "user": t(),
        "metadata": {t(): t()},
    }


def text_places(node, path: str = "") -> list[tuple[object, list]]:
    """Every string of the document, values and keys: (the path the error names, as a
    function of the key's new spelling for a key; the steps that reach it, the last one
    ("key", k) for a key)."""
    places = []
    if isinstance(node, str):
        places.append((lambda _, p=path: p, []))
    elif isinstance(node, dict):
        for key, value in node.items():
            sub = f"{path}.{key}" if path else key
            places.append((lambda k, p=path: f"{p}.{k}" if p else k, [("key", key)]))
            places += [(f, [key, *steps]) for f, steps in text_places(value, sub)]
    elif isinstance(node, list):
        for i, value in enumerate(node):
            places += [(f, [i, *steps]) for f, steps in text_places(value, f"{path}[{i}]")]
    return places


def inject(doc, steps: list, surrogate: str, at: int) -> str | None:
    """Put `surrogate` at `at` into the string `steps` lead to; for a key, return its new
    spelling as the error names it (the surrogate as a `\\udXXX` escape)."""
    *parents, last = steps
    node = doc
    for step in parents:
        node = node[step]
    if isinstance(last, tuple):  # a key
        key = last[1]
        new = key[:at] + surrogate + key[at:]
        node[new] = node.pop(key)
        return new.encode("utf-8", "backslashreplace").decode("utf-8")
    node[last] = node[last][:at] + surrogate + node[last][at:]
    return None


def post(client: Client, path: str, doc: dict):
    # json.dumps writes the surrogate as a \udXXX escape, as a hostile client would.
    return client.post(path, data=json.dumps(doc), content_type="application/json")


def check_refusal(response, expected: str) -> None:
    assert response.status_code == 400, response.content
    error = response.json()["error"]
    assert error["type"] == "invalid_request_error" and error["code"] is None
    assert error["param"] == expected
    assert error["message"].startswith(f"{expected}: ")
    assert "surrogate" in error["message"]
    # The error is well-formed text itself: it never echoes the surrogate back.
    json.dumps(response.json(), ensure_ascii=False).encode("utf-8")


def run_property(client, path: str, build, data) -> None:
    doc = build(data)
    name_of, steps = data.draw(st.sampled_from(text_places(doc)))
    surrogate = data.draw(SURROGATE)
    target = doc
    for step in steps[:-1]:
        target = target[step]
    last = steps[-1]
    length = len(last[1]) if isinstance(last, tuple) else len(target[last])
    at = data.draw(st.integers(0, length))
    expected = name_of(inject(doc, steps, surrogate, at))
    check_refusal(post(client, path, doc), expected)


PROPERTY = settings(
    max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True
)


@PROPERTY
@given(data=st.data())
def test_a_lone_surrogate_in_any_chat_field_is_a_400_naming_it(empty_runtime, data):
    run_property(Client(), "/v1/chat/completions", chat_body, data)


SESSION_BODIES = {
    "/session/release": lambda t: {"name": t(), "session_id": t()},
    "/session/restore": lambda t: {"name": t(), "session_id": t(), "blob": t(), "tokens": [1]},
    "/admin/session/export": lambda t: {"name": t(), "session_id": t(), "namespace": t()},
    "/admin/models/unload": lambda t: {"name": t()},
}


@pytest.mark.parametrize("path", sorted(SESSION_BODIES))
@PROPERTY
@given(data=st.data())
def test_a_lone_surrogate_in_a_session_or_operator_field_is_a_400_naming_it(
    empty_runtime, path, data
):
    def build(d):
        return SESSION_BODIES[path](lambda: d.draw(TEXT))

    run_property(Client(), path, build, data)


def test_the_issues_message_is_a_400_not_a_500(empty_runtime):
    body = '{"messages": [{"role": "user", "content": "x\\ud800y"}]}'
    response = Client().post("/v1/chat/completions", data=body, content_type="application/json")
    check_refusal(response, "messages[0].content")


@pytest.mark.parametrize(
    "doc,expected",
    [
        ({"a": "\U0001f600"}, None),  # a pair, joined by the parser: not lone
        ({"a": ["ok", {"b": "x\udc00"}]}, ("a[1].b", "\udc00")),
        ({"a": "\ud800", "b": "\ud801"}, ("a", "\ud800")),  # the first, in document order
        ({"\udfff": 1}, ("\\udfff", "\udfff")),
        ({"a": [[[["\ud8ff"]]]]}, ("a[0][0][0][0]", "\ud8ff")),
    ],
)
def test_lone_surrogate_at(doc, expected):
    assert lone_surrogate_at(doc) == expected


def test_a_surrogate_pair_spelled_as_escapes_is_fine(served):
    body = '{"messages": [{"role": "user", "content": "\\ud83d\\ude00"}], "max_tokens": 1}'
    response = Client().post("/v1/chat/completions", data=body, content_type="application/json")
    assert response.status_code == 200, response.content


@given(st.data())
@settings(max_examples=60, deadline=None)
def test_a_strict_text_field_refuses_a_lone_surrogate_as_drf_does(data):
    """Bodies that reach a serializer some other way than the JSON parser are still
    checked: StrictCharField's own check (at C speed) in place of DRF's per-character one,
    with DRF's message and code."""
    from rest_framework import serializers as drf

    from pantheon_platform.strict_json import StrictCharField

    field = StrictCharField(allow_blank=True, trim_whitespace=False)
    plain = TEXT.filter(lambda t: "\x00" not in t)  # DRF refuses NUL, a check of its own
    before, after = data.draw(plain), data.draw(plain)
    assert field.run_validation(before + after) == before + after
    surrogate = data.draw(SURROGATE)
    with pytest.raises(drf.ValidationError) as refused:
        field.run_validation(before + surrogate + after)
    assert refused.value.detail[0].code == "surrogate_characters_not_allowed"
    assert (
        str(refused.value.detail[0])
        == f"Surrogate characters are not allowed: U+{ord(surrogate):X}."
    )
    assert not any(
        type(v).__name__ == "ProhibitSurrogateCharactersValidator" for v in field.validators
    )
