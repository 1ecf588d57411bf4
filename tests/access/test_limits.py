"""Request limits: body size per route class (413 before Django reads the body), JSON
nesting, identifier lengths, array counts and every numeric field's range (400), always
in the error shape, never a 500 or a hang."""

from __future__ import annotations

import json

import pytest

from pantheon_platform import routes
from tests.access.asgi_raw import request, stack_app
from tests.wire.helpers import CHAT, HELLO

pytestmark = [pytest.mark.anyio, pytest.mark.django_db(transaction=True)]

MIB = 1 << 20
RELEASE = "/session/release"
RESTORE = "/session/restore"
LOAD = "/admin/models/load"


@pytest.fixture
def limits_app():
    return stack_app()


def nested(depth: int) -> bytes:
    """A chat body whose `messages[0]` holds arrays nested so that the body's own object
    and its arrays make `depth` levels."""
    inner = "[" * (depth - 3) + "]" * (depth - 3)  # body, messages, message: 3 levels
    return b'{"messages": [{"role": "user", "content": "hi", "x": ' + inner.encode() + b"}]}"


# --- body size: 413 --------------------------------------------------------------------


async def test_a_declared_chat_body_over_64_mib_is_413_before_the_app_runs(limits_app):
    reply = await request(limits_app, "POST", CHAT, b"", content_length=64 * MIB + 1)
    message = reply.error(413, "request_too_large")
    assert "64 MiB" in message and "chat" in message
    assert reply.chunks_read == 0  # answered from the header: the body was never read
    assert reply.headers["connection"] == "close"


async def test_a_declared_management_body_over_4_mib_is_413(limits_app):
    for path in (LOAD, RELEASE, "/admin/aliases", "/admin/session/export"):
        reply = await request(limits_app, "POST", path, b"", content_length=4 * MIB + 1)
        message = reply.error(413, "request_too_large")
        assert "4 MiB" in message and "management" in message
        assert reply.chunks_read == 0


async def test_a_body_without_content_length_is_counted_and_refused_past_the_limit(
    limits_app, empty_runtime
):
    chunks = [b"x" * MIB] * 5  # 5 MiB in 1 MiB pieces, no declared length
    reply = await request(limits_app, "POST", RELEASE, chunks=chunks, content_length=False)
    assert "4 MiB" in reply.error(413, "request_too_large")
    assert reply.chunks_read == 5  # the fifth crossed the limit; nothing more was asked for


async def test_a_chat_body_without_content_length_over_64_mib_is_413(limits_app, empty_runtime):
    chunks = [b" " * (8 * MIB)] * 9
    reply = await request(limits_app, "POST", CHAT, chunks=chunks, content_length=False)
    assert "64 MiB" in reply.error(413, "request_too_large")


async def test_a_body_just_under_the_management_limit_reaches_the_view(limits_app, served):
    prefix = b'{"session_id": "under-limit", "pad": "'
    body = prefix + b"x" * (4 * MIB - len(prefix) - 2) + b'"}'
    assert len(body) == 4 * MIB
    for content_length in (True, False):
        reply = await request(limits_app, "POST", RELEASE, body, content_length=content_length)
        assert reply.status == 200, reply.body[:300]
        assert reply.json() == {"released": True, "session_id": "under-limit"}


async def test_a_chat_body_over_4_mib_is_not_refused_by_size(limits_app, empty_runtime):
    content = "y" * (5 * MIB)
    body = {"messages": [{"role": "user", "content": content}]}
    reply = await request(limits_app, "POST", CHAT, body)
    reply.error(503, "no_models_loaded")  # past the size check and Django: the model lookup


@pytest.mark.parametrize(
    "value",
    ["12x", "-1", "1, 2", "", "0x10", "1.5"],
    ids=["alpha", "neg", "list", "empty", "hex", "dot"],
)
async def test_a_malformed_content_length_is_400(limits_app, value):
    reply = await request(limits_app, "POST", CHAT, b"{}", content_length=value)
    assert "Content-Length" in reply.error(400, "invalid_request_error")


async def test_two_content_lengths_are_400(limits_app):
    reply = await request(
        limits_app, "POST", CHAT, b"{}", content_length=True, headers={"content-length": "2"}
    )
    reply.error(400, "invalid_request_error")


async def test_an_absurd_content_length_is_413_not_a_crash(limits_app):
    reply = await request(limits_app, "POST", CHAT, b"", content_length="9" * 5000)
    reply.error(413, "request_too_large")


async def test_restore_takes_a_full_window_blob_past_64_mib(limits_app, served, smollm2_service):
    from pantheon_platform.routes import restore_body_limit

    # SmolLM2: ~80 KB of base64 per token, 8192 tokens: far more than 64 MiB.
    need = restore_body_limit()
    assert need > 64 * MIB
    assert routes.body_limit(RESTORE) == need  # the ASGI layer and the view agree
    assert routes.body_limit(CHAT) == 64 * MIB
    # A declared 64 MiB + 1 restore passes the layer (the short body is then a 400).
    reply = await request(limits_app, "POST", RESTORE, b"{}", content_length=64 * MIB + 1)
    assert reply.status == 400, reply.body
    reply = await request(limits_app, "POST", RESTORE, b"", content_length=need + 1)
    assert "/session/restore" in reply.error(413, "request_too_large")


async def test_restore_without_a_model_keeps_the_64_mib_floor(limits_app, empty_runtime):
    assert routes.body_limit(RESTORE) == 64 * MIB
    reply = await request(limits_app, "POST", RESTORE, b"", content_length=64 * MIB + 1)
    reply.error(413, "request_too_large")


# --- JSON nesting ----------------------------------------------------------------------


async def test_nesting_of_64_levels_is_accepted_65_is_400(limits_app, empty_runtime):
    reply = await request(limits_app, "POST", CHAT, nested(64))
    reply.error(503, "no_models_loaded")  # parsed and validated
    reply = await request(limits_app, "POST", CHAT, nested(65))
    assert "nested too deeply" in reply.error(400, "invalid_request_error")


@pytest.mark.parametrize("path", [CHAT, RELEASE, LOAD, "/admin/aliases"])
async def test_deep_nesting_is_400_on_every_json_route(limits_app, empty_runtime, path):
    for depth in (65, 100_000):
        body = b'{"a": ' + b"[" * depth + b"]" * depth + b"}"
        reply = await request(limits_app, "POST", path, body)
        assert "nested too deeply" in reply.error(400, "invalid_request_error")


async def test_a_huge_integer_literal_is_400(limits_app, empty_runtime):
    body = b'{"messages": [], "seed": ' + b"9" * 5000 + b"}"
    reply = await request(limits_app, "POST", CHAT, body)
    reply.error(400, "invalid_request_error")


# --- identifiers and counts ------------------------------------------------------------

LONG = "m" * 257


@pytest.mark.parametrize(
    "extra,field",
    [
        ({"model": LONG}, "model"),
        ({"session_id": LONG}, "session_id"),
        ({"prompt_cache_key": LONG}, "prompt_cache_key"),
        ({"stop": LONG}, "stop"),
        ({"stop": ["ok", LONG]}, "stop"),
        ({"stop": ["s"] * 17}, "stop"),
    ],
)
async def test_over_long_identifiers_are_400(limits_app, empty_runtime, extra, field):
    reply = await request(limits_app, "POST", CHAT, {"messages": HELLO, **extra})
    assert reply.error(400, "invalid_request_error").startswith(field + ":")


async def test_an_over_long_session_header_is_400(limits_app, served):
    reply = await request(
        limits_app, "POST", CHAT, {"messages": HELLO}, headers={"x-session-id": LONG}
    )
    assert "X-Session-Id" in reply.error(400, "invalid_request_error")


async def test_over_long_names_on_the_session_and_operator_routes_are_400(limits_app, served):
    reply = await request(limits_app, "POST", RELEASE, {"session_id": "s", "name": LONG})
    assert reply.error(400, "invalid_request_error").startswith("name:")
    reply = await request(limits_app, "POST", RELEASE, {"session_id": LONG})
    assert reply.error(400, "invalid_request_error").startswith("session_id:")
    reply = await request(limits_app, "POST", "/admin/models/unload", {"name": LONG})
    assert reply.error(400, "invalid_request_error").startswith("name:")
    reply = await request(limits_app, "POST", "/admin/aliases", {"alias": LONG, "target": "x"})
    assert reply.error(400, "invalid_request_error").startswith("alias:")
    reply = await request(limits_app, "DELETE", "/admin/aliases/" + "a" * 201, b"")
    assert reply.error(400, "invalid_request_error").startswith("alias:")


async def test_messages_past_the_bound_are_400(limits_app, empty_runtime, settings):
    body = {"messages": [{"role": "user", "content": "x"}] * 4097}
    message = (await request(limits_app, "POST", CHAT, body)).error(400, "invalid_request_error")
    assert message.startswith("messages:") and "4096" in message
    settings.PANTHEON_MAX_MESSAGES = 2
    body = {"messages": HELLO * 3}
    message = (await request(limits_app, "POST", CHAT, body)).error(400, "invalid_request_error")
    assert "PANTHEON_MAX_MESSAGES" in message
    reply = await request(limits_app, "POST", CHAT, {"messages": HELLO * 2})
    reply.error(503, "no_models_loaded")


async def test_tools_past_the_bound_are_400(limits_app, empty_runtime):
    tool = {"type": "function", "function": {"name": "f", "parameters": {}}}
    body = {"messages": HELLO, "tools": [tool] * 129}
    message = (await request(limits_app, "POST", CHAT, body)).error(400, "invalid_request_error")
    assert message.startswith("tools:") and "128" in message


# --- numeric ranges --------------------------------------------------------------------


def raw_chat(field: str, literal: str) -> bytes:
    return f'{{"messages": {json.dumps(HELLO)}, "{field}": {literal}}}'.encode()


@pytest.mark.parametrize(
    "field,literal",
    [
        ("temperature", "100.5"),
        ("temperature", "-101"),
        ("temperature", "1e400"),  # parses as infinity
        ("temperature", "1" + "0" * 400),  # an integer past any float
        ("top_p", "1.5"),
        ("top_p", "-0.1"),
        ("top_k", str(1 << 31)),
        ("top_k", str(-(1 << 31) - 1)),
        ("min_p", "1e400"),
        ("repetition_penalty", "0"),
        ("repetition_penalty", "-0"),
        ("repetition_penalty", "101"),
        ("presence_penalty", "1" + "0" * 400),
        ("frequency_penalty", "-1e400"),
        ("seed", str(1 << 64)),
        ("seed", str(-(1 << 64))),
        ("seed", "1e300"),
        ("max_tokens", "1" + "0" * 400),
        ("max_completion_tokens", str(1 << 64)),
        ("n", "-0"),
        ("n", str(1 << 64)),
        ("top_logprobs", "1" + "0" * 30),
        ("reasoning_budget", str(1 << 70)),
        ("max_reasoning_tokens", "-" + "9" * 30),
        ("temperature", "NaN"),
        ("top_p", "-Infinity"),
    ],
)
async def test_numbers_out_of_range_are_400(limits_app, empty_runtime, field, literal):
    reply = await request(limits_app, "POST", CHAT, raw_chat(field, literal))
    message = reply.error(400, "invalid_request_error")
    assert message.startswith(field + ":") or "not valid JSON" in message, message


@pytest.mark.parametrize(
    "field,literal",
    [
        ("temperature", "-0"),
        ("temperature", "100"),
        ("temperature", "-100"),
        ("top_p", "0"),
        ("top_p", "1"),
        ("top_k", "-1"),
        ("seed", str((1 << 64) - 1)),
        ("max_tokens", str(10**12)),  # clamped (the contract)
        ("n", "1000"),  # capped at 8 (the contract)
        ("top_logprobs", "1000"),  # clamped to 20 (the contract)
        ("presence_penalty", "50"),  # clamped to 2 (the contract)
        ("min_p", "3"),  # clamped to 1
        ("repetition_penalty", "100"),
    ],
)
async def test_numbers_in_range_or_clamped_by_the_contract_pass(
    limits_app, empty_runtime, field, literal
):
    reply = await request(limits_app, "POST", CHAT, raw_chat(field, literal))
    reply.error(503, "no_models_loaded")


def test_logit_bias_is_bounded_and_never_overflows():
    from wire.openai_chat.request import ChatCompletionRequest

    def bias(value):
        request = ChatCompletionRequest(data={"messages": HELLO, "logit_bias": value})
        return request, request.is_valid()

    request, ok = bias({str(i): 1 for i in range(1025)})
    assert not ok and "logit_bias" in request.errors
    request, ok = bias(
        {"5": 10**400, "6": -(10**400), "²": 1, "9" * 5000: 1, "7": 1e300, " 8 ": -3}
    )
    assert ok, request.errors
    # Clamped to [-100, 100]; non-ASCII digits and ids past int32 skipped (the contract).
    assert request.validated_data["logit_bias"] == ((5, 100.0), (6, -100.0), (7, 100.0), (8, -3.0))


async def test_logit_bias_over_its_bound_is_400_over_http(limits_app, empty_runtime):
    body = {"messages": HELLO, "logit_bias": {str(i): 1 for i in range(1025)}}
    reply = await request(limits_app, "POST", CHAT, body)
    assert reply.error(400, "invalid_request_error").startswith("logit_bias:")


@pytest.mark.parametrize(
    "extra",
    [
        {"ctx_cap": 10**400},
        {"ctx_cap": -1},
        {"max_sessions": 1025},
        {"max_concurrent": 10**30},
        {"reasoning_budget": (1 << 24) + 1},
        {"dies": [10**30]},
        {"dies": [1e400]},
    ],
)
async def test_operator_numbers_out_of_range_are_400(limits_app, empty_runtime, extra):
    body = json.dumps({"path": "tiny.gguf", **extra}).replace("Infinity", "1e400")
    reply = await request(limits_app, "POST", LOAD, body.encode())
    reply.error(400, "invalid_request_error")


async def test_restore_tokens_are_bounded(limits_app, served, smollm2_service):
    window = smollm2_service.context_window_configured
    body = {"session_id": "s", "blob": "", "tokens": [1] * (window + 1)}
    message = (await request(limits_app, "POST", RESTORE, body)).error(400, "invalid_request_error")
    assert "context window" in message
    for token in (1 << 31, -1, 10**400, 1.5):
        body = {"session_id": "s", "blob": "", "tokens": [token]}
        reply = await request(limits_app, "POST", RESTORE, body)
        assert reply.error(400, "invalid_request_error").startswith("tokens:")


async def test_estimate_numbers_are_bounded(limits_app, served):
    for query in ("tokens=" + "9" * 40, "tokens=-0", "tokens=5&upload_bps=1e400"):
        reply = await request(limits_app, "GET", "/session/estimate", b"", query=query)
        reply.error(400, "invalid_request_error")
