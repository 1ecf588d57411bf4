"""Session routes on the real SmolLM2: export, restore, release, estimate, and the watch
consumer driven through raw ASGI (over a real Daphne: tests/e2e/test_session_watch.py)."""

from __future__ import annotations

import asyncio
import base64
import dataclasses
import json

import pytest

from engine.serving import session_blob, session_blob_read
from sessions import consumers
from sessions.consumers import SessionWatchConsumer
from tests.conftest import SMOLLM2_NAME
from tests.wire.helpers import CHAT, AsgiCall

pytestmark = pytest.mark.anyio

EXPORT = "/admin/session/export"
RESTORE = "/session/restore"
RELEASE = "/session/release"
ESTIMATE = "/session/estimate"
NAME_TURN = [{"role": "user", "content": "My name is Ann. Say hi."}]
FOLLOW_UP = {"role": "user", "content": "What is my name?"}
SMOLLM2_KV_BYTES_PER_TOKEN = 46080  # 2 (K, V) * 30 layers * 3 KV heads * 64 * 4 bytes


# --- helpers ---------------------------------------------------------------------------


async def post(client, path: str, body, **headers):
    data = body if isinstance(body, bytes | str) else json.dumps(body)
    return await client.post(path, data=data, content_type="application/json", headers=headers)


async def turn(client, messages, session_id, *, model=None, max_tokens=2) -> dict:
    body = {"messages": messages, "temperature": 0, "max_tokens": max_tokens}
    if session_id is not None:
        body["session_id"] = session_id
    if model is not None:
        body["model"] = model
    response = await post(client, CHAT, body)
    assert response.status_code == 200, response.content
    return response.json()


def content(answer: dict) -> str:
    return answer["choices"][0]["message"]["content"]


def cached(answer: dict) -> int:
    return answer["usage"]["prompt_tokens_details"]["cached_tokens"]


def follow_up(answer: dict) -> list[dict]:
    return [*NAME_TURN, {"role": "assistant", "content": content(answer)}, FOLLOW_UP]


async def export(client, session_id: str, **extra) -> dict:
    response = await post(client, EXPORT, {"session_id": session_id, **extra})
    assert response.status_code == 200, response.content
    return response.json()


def error_of(response, status: int, type_: str) -> str:
    assert response.status_code == status, response.content
    assert response["Content-Type"] == "application/json"
    error = response.json()["error"]
    assert error["type"] == type_ and error["code"] is None
    return error["message"]


def b64(blob: bytes) -> str:
    return base64.b64encode(blob).decode()


@pytest.fixture
def sibling(served, smollm2_service):
    """Registers more instances over SmolLM2's weights (each with its own session table)
    next to it; with two models served, an unknown name is a 404. Closed afterwards."""
    made = []

    def make(name: str, **config):
        svc = smollm2_service.sibling(
            dataclasses.replace(smollm2_service.config, name=name, ctx_cap=512, **config)
        )
        made.append(svc)
        served.register(name, svc)
        return svc

    yield make
    for svc in made:
        svc.close()


@pytest.fixture
def tiny_cap(sibling):
    return sibling("tiny-cap", max_sessions=1)


# --- export -> release -> restore -> continue ----------------------------------------


async def test_a_restored_session_continues_like_one_never_exported(
    client, served, smollm2_service
):
    first = await turn(client, NAME_TURN, "rt-reference", max_tokens=6)
    reference = await turn(client, follow_up(first), "rt-reference", max_tokens=6)

    again = await turn(client, NAME_TURN, "rt-trip", max_tokens=6)
    assert content(again) == content(first)
    exported = await export(client, "rt-trip")
    blob = base64.b64decode(exported["blob_b64"], validate=True)
    assert exported["session_id"] == "rt-trip"
    assert exported["weights_version"] == smollm2_service.weights_version
    assert exported["blob_bytes"] == len(blob)
    assert exported["n_tok"] == len(exported["tokens"]) > 0
    assert session_blob_read.read_header(blob)["tokens"] == exported["tokens"]

    response = await post(client, RELEASE, {"session_id": "rt-trip"})
    assert response.json() == {"released": True, "session_id": "rt-trip"}
    assert "rt-trip" not in smollm2_service.sessions

    restore = {"blob": exported["blob_b64"], "tokens": exported["tokens"]}
    response = await post(client, RESTORE, {"session_id": "rt-trip", **restore})
    assert response.status_code == 200, response.content
    assert response.json() == {
        "restored": True,
        "session_id": "rt-trip",
        "n_tok": exported["n_tok"],
    }

    resumed = await turn(client, follow_up(first), "rt-trip", max_tokens=6)
    assert content(resumed) == content(reference)
    assert cached(resumed) == exported["n_tok"] == cached(reference)

    # The same blob under another id (the header names it this time).
    response = await post(client, RESTORE, restore, **{"X-Session-Id": "rt-elsewhere"})
    assert response.status_code == 200, response.content
    assert response.json()["session_id"] == "rt-elsewhere"
    moved = await turn(client, follow_up(first), "rt-elsewhere", max_tokens=6)
    assert content(moved) == content(reference)
    assert cached(moved) == exported["n_tok"]


# --- bad restores ----------------------------------------------------------------------


def _flip_a_payload_byte(blob: bytes) -> bytes:
    corrupted = bytearray(blob)
    corrupted[len(blob) // 2] ^= 0x40  # inside K or V, past the header
    return bytes(corrupted)


def _reencoded(blob: bytes, layout, **changes) -> bytes:
    snap = session_blob_read.decode(blob, layout)
    return session_blob.encode(
        dataclasses.replace(snap, layout=dataclasses.replace(snap.layout, **changes))
    )


BAD_RESTORES = {
    # case: (blob, tokens) from (blob, tokens, layout), then the status and type
    "corrupted payload": (lambda b, t, lay: (b64(_flip_a_payload_byte(b)), t), 400),
    "truncated": (lambda b, t, lay: (b64(b[:-100]), t), 400),
    "not base64": (lambda b, t, lay: ("this is not base64!", t), 400),
    "base64 of garbage": (lambda b, t, lay: (b64(b"PNKV but not a blob"), t), 400),
    "another architecture": (
        lambda b, t, lay: (b64(_reencoded(b, lay, architecture="qwen2")), t),
        400,
    ),
    "another weights version": (
        lambda b, t, lay: (b64(_reencoded(b, lay, weights_version="0" * 16)), t),
        409,
    ),
    "tokens one short": (lambda b, t, lay: (b64(b), t[:-1]), 400),
    "tokens not the blob's": (lambda b, t, lay: (b64(b), [*t[:-1], (t[-1] + 1) % 1000]), 400),
}


@pytest.mark.parametrize("case", list(BAD_RESTORES))
async def test_a_bad_restore_is_refused_and_changes_nothing(client, served, smollm2_service, case):
    source = await turn(client, NAME_TURN, "bad-source", max_tokens=1)
    other = await turn(client, [{"role": "user", "content": "Hi"}], "bad-other", max_tokens=1)
    exported = await export(client, "bad-source")
    before = {i.session_id: i.tokens for i in smollm2_service.session_info()}

    make, status = BAD_RESTORES[case]
    blob = base64.b64decode(exported["blob_b64"])
    blob_b64, tokens = make(blob, exported["tokens"], smollm2_service.kv_layout)
    for target in ("bad-source", "bad-new"):  # replacing a live session, or a new one
        body = {"session_id": target, "blob": blob_b64, "tokens": tokens}
        response = await post(client, RESTORE, body)
        type_ = "weights_version_mismatch" if status == 409 else "bad_session_blob"
        error_of(response, status, type_)

    assert {i.session_id: i.tokens for i in smollm2_service.session_info()} == before
    for answer, session in ((source, "bad-source"), (other, "bad-other")):
        messages = [
            {"role": "user", "content": "Hi"} if session == "bad-other" else NAME_TURN[0],
            {"role": "assistant", "content": content(answer)},
            FOLLOW_UP,
        ]
        assert cached(await turn(client, messages, session, max_tokens=1)) > 0


async def test_restore_refuses_missing_and_mistyped_fields(client, served):
    good = {"session_id": "x", "blob": "AAAA", "tokens": [1, 2]}
    cases = [
        b"",
        b"{not json",
        b"[1, 2]",
        {k: v for k, v in good.items() if k != "session_id"},
        {**good, "session_id": 7},
        {**good, "session_id": "s" * 257},
        {k: v for k, v in good.items() if k != "blob"},
        {**good, "blob": 12},
        {**good, "blob": None},
        {k: v for k, v in good.items() if k != "tokens"},
        {**good, "tokens": "1 2"},
        {**good, "tokens": [1, "2"]},
        {**good, "tokens": [1, 2.5]},
        {**good, "tokens": [True, 2]},
        {**good, "tokens": [-1]},
        {**good, "name": 3},
    ]
    for body in cases:
        message = error_of(await post(client, RESTORE, body), 400, "invalid_request_error")
        assert message, body


async def test_restore_at_capacity_is_429_with_retry_after(client, tiny_cap):
    held = await turn(client, NAME_TURN, "cap-held", model="tiny-cap", max_tokens=1)
    exported = await export(client, "cap-held", name="tiny-cap")
    restore = {"name": "tiny-cap", "blob": exported["blob_b64"], "tokens": exported["tokens"]}

    response = await post(client, RESTORE, {**restore, "session_id": "cap-new"})
    message = error_of(response, 429, "model_at_session_capacity")
    assert response["Retry-After"] == "30"
    assert "1 session slots" in message
    assert "cap-new" not in tiny_cap.sessions

    # Restoring over the id that holds the slot needs no new one.
    response = await post(client, RESTORE, {**restore, "session_id": "cap-held"})
    assert response.status_code == 200, response.content
    assert cached(await turn(client, follow_up(held), "cap-held", model="tiny-cap")) > 0


async def test_chat_with_a_new_session_on_a_full_table_is_429_and_names_re_prefill(
    client, tiny_cap
):
    await turn(client, NAME_TURN, "cap-held", model="tiny-cap", max_tokens=1)
    body = {"model": "tiny-cap", "messages": NAME_TURN, "max_tokens": 1, "session_id": "cap-2"}
    response = await post(client, CHAT, body)
    message = error_of(response, 429, "model_at_session_capacity")
    assert response["Retry-After"] == "30"
    assert "re-prefill" in message and "/session/release" in message

    # Released, the slot takes the new id.
    await post(client, RELEASE, {"name": "tiny-cap", "session_id": "cap-held"})
    assert (await post(client, CHAT, body)).status_code == 200


async def test_a_blob_restores_into_another_instance_of_the_same_weights(client, tiny_cap):
    first = await turn(client, NAME_TURN, "cross", model=SMOLLM2_NAME, max_tokens=4)
    exported = await export(client, "cross", name=SMOLLM2_NAME)
    body = {"name": "tiny-cap", "session_id": "cross", "blob": exported["blob_b64"]}
    response = await post(client, RESTORE, {**body, "tokens": exported["tokens"]})
    assert response.status_code == 200, response.content
    resumed = await turn(client, follow_up(first), "cross", model="tiny-cap", max_tokens=1)
    assert cached(resumed) == exported["n_tok"]


async def test_a_restore_body_may_pass_djangos_upload_limit_up_to_a_full_window(
    client, empty_runtime, smollm2_service, settings
):
    small = smollm2_service.sibling(
        dataclasses.replace(smollm2_service.config, name="small-window", ctx_cap=64)
    )
    try:
        empty_runtime.register("small-window", small)
        settings.DATA_UPLOAD_MAX_MEMORY_SIZE = 1000  # far below one blob
        await turn(client, NAME_TURN, "big-body", max_tokens=1)
        exported = await export(client, "big-body")
        body = {"session_id": "big-body", "blob": exported["blob_b64"]}
        body = json.dumps({**body, "tokens": exported["tokens"]})
        assert len(body) > 2_000_000
        response = await post(client, RESTORE, body)
        assert response.status_code == 200, response.content

        # The bound: base64 of 64 tokens of KV, their ids, and 1 MiB for the rest.
        limit = 64 * (SMOLLM2_KV_BYTES_PER_TOKEN * 4 // 3 + 40) + (1 << 20)
        too_big = body[:-1] + " " * (limit + 1 - len(body)) + "}"
        message = error_of(await post(client, RESTORE, too_big), 400, "invalid_request_error")
        assert f"over {limit} bytes" in message
        # Other routes keep Django's limit.
        response = await post(client, RELEASE, {"session_id": "big-body", "pad": "x" * 1000})
        error_of(response, 400, "invalid_request_error")
    finally:
        small.close()


# --- export errors ---------------------------------------------------------------------


async def test_export_of_an_unknown_session_is_404(client, served):
    response = await post(client, EXPORT, {"session_id": "never-seen"})
    assert "never-seen" in error_of(response, 404, "session_not_found")


async def test_export_needs_a_session_id_in_the_body(client, served):
    await turn(client, NAME_TURN, "in-header", max_tokens=1)
    for body in (b"", b"nope", b"null", {}, {"session_id": ""}, {"session_id": ["a"]}):
        error_of(await post(client, EXPORT, body), 400, "invalid_request_error")
    # Export reads the body only, never X-Session-Id.
    response = await post(client, EXPORT, {}, **{"X-Session-Id": "in-header"})
    error_of(response, 400, "invalid_request_error")


async def test_export_of_a_session_with_a_turn_in_flight_is_429_busy(
    client, asgi_app, served, smollm2_service
):
    await turn(client, NAME_TURN, "busy", max_tokens=1)
    good = await export(client, "busy")
    long = [{"role": "user", "content": "Count from 1 to 1000, separated by commas."}]
    body = {"messages": long, "max_tokens": 200, "stream": True, "session_id": "busy"}
    streaming = AsgiCall(asgi_app, CHAT, json.dumps(body).encode()).start()
    await streaming.wait_for(lambda c: bool(c.chunks), timeout=120)
    # A stalled client: the view cannot take the stream further, so the turn stays in
    # flight until the hang-up, however fast the engine is.
    streaming.stall = True
    assert streaming.status == 200
    try:
        response = await post(client, EXPORT, {"session_id": "busy"})
        assert "in flight" in error_of(response, 429, "session_busy")
        assert response["Retry-After"] == "1"
        # A restore over it: a bad blob is still refused as such; a good one waits.
        restore = {"session_id": "busy", "blob": "AAAA", "tokens": [1]}
        error_of(await post(client, RESTORE, restore), 400, "bad_session_blob")
        restore = {"session_id": "busy", "blob": good["blob_b64"], "tokens": good["tokens"]}
        error_of(await post(client, RESTORE, restore), 429, "session_busy")
    finally:
        streaming.hang_up.set()
        await asyncio.wait_for(streaming.task, 30)


async def test_export_and_restore_of_a_model_without_sessions_are_400(client, sibling):
    sibling("no-cache", max_sessions=0)
    cases = [
        (EXPORT, {"name": "no-cache", "session_id": "s"}),
        (RESTORE, {"name": "no-cache", "session_id": "s", "blob": "AAAA", "tokens": [1]}),
    ]
    for path, body in cases:
        error_of(await post(client, path, body), 400, "session_caching_disabled")


async def test_session_routes_name_an_unknown_model_404(client, tiny_cap):
    cases = [
        (EXPORT, {"name": "nope", "session_id": "s"}),
        (RESTORE, {"name": "nope", "session_id": "s", "blob": "AAAA", "tokens": [1]}),
        (RELEASE, {"name": "nope", "session_id": "s"}),
    ]
    for path, body in cases:
        assert "nope" in error_of(await post(client, path, body), 404, "model_not_found")


async def test_session_routes_allow_only_post(client, served):
    for path in (EXPORT, RESTORE, RELEASE):
        response = await client.get(path)
        error_of(response, 405, "method_not_allowed")
        assert response["Allow"] == "POST, OPTIONS"
        assert (await client.options(path)).status_code == 200
        error_of(await client.get(path + "/"), 404, "not_found")


# --- release ---------------------------------------------------------------------------


async def test_release_is_idempotent(client, served):
    for _ in range(2):
        response = await post(client, RELEASE, {"session_id": "never-seen"})
        assert response.status_code == 200
        assert response.json() == {"released": True, "session_id": "never-seen"}
        assert response["Access-Control-Allow-Origin"] == "*"


async def test_after_release_the_next_turn_is_cold(client, served, smollm2_service):
    first = await turn(client, NAME_TURN, "to-release", max_tokens=2)
    response = await post(client, RELEASE, {}, **{"X-Session-Id": "to-release"})
    assert response.json() == {"released": True, "session_id": "to-release"}
    assert "to-release" not in smollm2_service.sessions
    assert cached(await turn(client, follow_up(first), "to-release", max_tokens=1)) == 0


async def test_release_needs_a_session_id(client, served):
    for body in (b"", b"{", {}, {"session_id": 3}, {"session_id": ""}):
        error_of(await post(client, RELEASE, body), 400, "invalid_request_error")


# --- estimate --------------------------------------------------------------------------


async def estimate(client, **params):
    return await client.get(ESTIMATE, params)


async def test_estimate_arithmetic_with_a_given_blob_size_and_rate(client, served, smollm2_service):
    response = await estimate(client, tokens=1000, blob_bytes=25_000_000, upload_bps=1e7)
    assert response.status_code == 200, response.content
    seconds, rate, measured = smollm2_service.estimate_prefill_s(1000)
    assert response.json() == {
        "model": SMOLLM2_NAME,
        "tokens": 1000,
        "prefill_tok_per_s": round(rate, 2),
        "cold_reprefill_s": round(1000 / rate, 3),
        "warm_restore_s": 2.5,
        "blob_bytes_est": 25_000_000,
        "prefill_rate_measured": measured,
    }
    assert response["Access-Control-Allow-Origin"] == "*"


async def test_estimate_sizes_the_blob_from_the_models_kv(client, served, smollm2_service):
    assert smollm2_service.kv.bytes_per_token() == SMOLLM2_KV_BYTES_PER_TOKEN
    body = (await estimate(client, tokens=100, name=SMOLLM2_NAME)).json()
    assert body["blob_bytes_est"] == 100 * SMOLLM2_KV_BYTES_PER_TOKEN
    assert body["warm_restore_s"] == 0.369  # 4_608_000 B at 12.5 MB/s = 0.36864 s


async def test_estimate_measures_the_rate_once_a_prefill_ran(client, served, smollm2_service):
    await turn(client, NAME_TURN, None, max_tokens=1)
    body = (await estimate(client, tokens=500)).json()
    assert body["prefill_rate_measured"] is True
    rate = smollm2_service.stats.prefill_tok_per_s
    assert body["prefill_tok_per_s"] == round(rate, 2)
    assert body["cold_reprefill_s"] == round(500 / rate, 3)


async def test_estimate_for_an_unknown_model_uses_the_contract_fallbacks(client, tiny_cap):
    response = await estimate(client, tokens=4096, name="nope")
    assert response.status_code == 200
    assert response.json() == {
        "model": "",
        "tokens": 4096,
        "prefill_tok_per_s": 100.0,
        "cold_reprefill_s": 40.96,
        "warm_restore_s": 5.369,  # 4096 * 16 KiB at 12.5 MB/s
        "blob_bytes_est": 4096 * 16384,
        "prefill_rate_measured": False,
    }


async def test_estimate_with_no_model_loaded_is_not_an_error(client, empty_runtime):
    response = await estimate(client, tokens=10, blob_bytes=1000, upload_bps=500)
    assert response.status_code == 200
    body = response.json()
    assert body["model"] == "" and body["blob_bytes_est"] == 1000
    assert body["warm_restore_s"] == 2.0 and body["cold_reprefill_s"] == 0.1


@pytest.mark.parametrize(
    "params",
    [
        {},
        {"tokens": ""},
        {"tokens": "abc"},
        {"tokens": "1.5"},
        {"tokens": "1e3"},
        {"tokens": "0"},
        {"tokens": "-3"},
        {"tokens": str(1 << 64)},
        {"tokens": "10", "blob_bytes": "0"},
        {"tokens": "10", "blob_bytes": "-1"},
        {"tokens": "10", "blob_bytes": "many"},
        {"tokens": "10", "blob_bytes": ""},
        {"tokens": "10", "upload_bps": "0"},
        {"tokens": "10", "upload_bps": "-5"},
        {"tokens": "10", "upload_bps": "nan"},
        {"tokens": "10", "upload_bps": "inf"},
        {"tokens": "10", "upload_bps": "fast"},
    ],
)
async def test_estimate_refuses_bad_numbers(client, served, params):
    message = error_of(await estimate(client, **params), 400, "invalid_request_error")
    assert message.split(":")[0] in {"tokens", "blob_bytes", "upload_bps"}


async def test_estimate_allows_only_get(client, served):
    response = await post(client, ESTIMATE + "?tokens=5", {})
    error_of(response, 405, "method_not_allowed")
    assert response["Allow"] == "GET, OPTIONS"


# --- the watch consumer, over raw ASGI ---------------------------------------------------


@pytest.fixture(autouse=True)
def watch_may_touch_the_database(request):
    """Channels' consumer closes stale database connections as it dispatches (as it does
    in the server); an async test with database access before this one (pytest-django
    runs those first) can leave one in the context it runs in. Let it look."""
    if "watch" in request.node.name:
        request.getfixturevalue("db")


class Watch:
    """One request to the watch consumer, with a client that can hang up."""

    def __init__(self, query: str = "", method: str = "GET", headers: dict | None = None):
        self.scope = {
            "type": "http",
            "asgi": {"version": "3.0"},
            "http_version": "1.1",
            "method": method,
            "scheme": "http",
            "path": "/session/watch",
            "raw_path": b"/session/watch",
            "query_string": query.encode(),
            "root_path": "",
            "headers": [(k.lower().encode(), v.encode()) for k, v in (headers or {}).items()],
            "client": ("127.0.0.1", 50000),
            "server": ("testserver", 80),
        }
        self.start_message: dict | None = None
        self.bodies: list[dict] = []
        self.got = asyncio.Event()
        self.hang_up = asyncio.Event()
        self._requested = False
        self.task: asyncio.Task | None = None

    async def _receive(self):
        if not self._requested:
            self._requested = True
            return {"type": "http.request", "body": b"", "more_body": False}
        await self.hang_up.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message):
        if message["type"] == "http.response.start":
            self.start_message = message
        else:
            self.bodies.append(message)
        self.got.set()

    def start(self) -> Watch:
        app = SessionWatchConsumer.as_asgi()
        self.task = asyncio.create_task(app(self.scope, self._receive, self._send))
        return self

    async def wait_for_bodies(self, n: int, timeout: float = 10) -> None:
        async def poll():
            while len(self.bodies) < n:
                self.got.clear()
                await self.got.wait()

        await asyncio.wait_for(poll(), timeout)

    @property
    def status(self) -> int:
        return self.start_message["status"]

    @property
    def headers(self) -> dict[str, str]:
        return {k.decode(): v.decode() for k, v in self.start_message["headers"]}

    async def answer(self, timeout: float = 10) -> dict:
        """A refused watch: the consumer answers and ends by itself."""
        await asyncio.wait_for(self.task, timeout)
        assert self.headers["access-control-allow-origin"] == "*"
        assert self.headers["connection"] == "close"
        return json.loads(b"".join(b["body"] for b in self.bodies))


async def test_a_watch_holds_the_session_until_the_client_goes(
    served, smollm2_service, monkeypatch
):
    monkeypatch.setattr(consumers, "KEEPALIVE_S", 0.05)
    watch = Watch("session_id=held").start()
    await watch.wait_for_bodies(1)
    assert watch.status == 200
    assert watch.headers["content-type"] == "text/event-stream"
    assert watch.headers["cache-control"] == "no-cache"
    assert watch.headers["access-control-allow-origin"] == "*"
    assert watch.bodies[0] == {
        "type": "http.response.body",
        "body": b": watch established\n\n",
        "more_body": True,
    }
    assert smollm2_service.sessions.watches("held") == 1

    await watch.wait_for_bodies(3)  # keepalive comments, the response still open
    assert all(b == {**watch.bodies[0], "body": b": keepalive\n\n"} for b in watch.bodies[1:])
    assert not watch.task.done()

    watch.hang_up.set()
    await asyncio.wait_for(watch.task, 5)
    assert smollm2_service.sessions.watches("held") == 0
    sent = len(watch.bodies)
    await asyncio.sleep(0.2)
    assert len(watch.bodies) == sent  # the keepalives stopped with it


async def test_each_closed_watch_drops_exactly_its_own_hold(served, smollm2_service):
    first = Watch("session_id=twice").start()
    second = Watch("", headers={"X-Session-Id": "twice"}).start()
    await first.wait_for_bodies(1)
    await second.wait_for_bodies(1)
    assert smollm2_service.sessions.watches("twice") == 2

    first.hang_up.set()
    await asyncio.wait_for(first.task, 5)
    assert smollm2_service.sessions.watches("twice") == 1

    # A server stopping the consumer (cancelling it) drops the hold too.
    second.task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await second.task
    assert smollm2_service.sessions.watches("twice") == 0


async def test_a_watch_on_a_full_watch_table_is_503(sibling):
    small = sibling("few-watches", max_watches=1)
    held = Watch("session_id=a&name=few-watches").start()
    await held.wait_for_bodies(1)
    try:
        refused = Watch("session_id=b&name=few-watches").start()
        body = await refused.answer()
        assert refused.status == 503 and body["error"]["type"] == "watch_unavailable"
        assert small.sessions.watches("b") == 0
    finally:
        held.hang_up.set()
        await asyncio.wait_for(held.task, 5)


@pytest.mark.parametrize(
    "query, status, type_",
    [
        ("", 400, "invalid_request_error"),
        ("session_id=", 400, "invalid_request_error"),
        ("session_id=" + "s" * 257, 400, "invalid_request_error"),
        ("session_id=s&name=nope", 404, "model_not_found"),
        ("session_id=s&name=no-cache", 400, "session_caching_disabled"),
    ],
)
async def test_a_watch_that_cannot_be_held_gets_the_error_shape(
    sibling, smollm2_service, query, status, type_
):
    sibling("no-cache", max_sessions=0)
    watch = Watch(query).start()
    body = await watch.answer()
    assert watch.status == status
    assert watch.headers["content-type"] == "application/json"
    assert body["error"]["type"] == type_ and body["error"]["code"] is None
    assert smollm2_service.sessions.watches("s") == 0


async def test_the_watch_route_answers_405_and_the_preflight(served):
    watch = Watch("session_id=s", method="POST").start()
    body = await watch.answer()
    assert watch.status == 405 and body["error"]["type"] == "method_not_allowed"
    assert watch.headers["allow"] == "GET, OPTIONS"

    preflight = Watch("", method="OPTIONS", headers={"Access-Control-Request-Headers": "x"})
    assert await preflight.start().answer() == {}
    assert preflight.status == 200
    assert preflight.headers["access-control-allow-headers"] == "x"
