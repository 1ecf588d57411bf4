"""The Batches API through the unmodified OpenAI SDK in-process, with a batch runner on
the test database: a JSONL of chat and embeddings lines (a few invalid) runs to
`completed`, its output bodies equal to the same requests sent directly (greedy), the
invalid lines in the error file by custom_id; bad input fails the batch up front; another
key can neither see, read nor cancel; a runner stopped mid-batch and a new one started
finish it with every custom_id exactly once; cancel keeps what finished."""

from __future__ import annotations

import asyncio
import json

import openai
import pytest

from tests.access.helpers import bearer
from tests.access.helpers import call as raw_call
from tests.wire.files.sdk_helpers import new_key, sdk

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.anyio]

CHAT, EMBED = "/v1/chat/completions", "/v1/embeddings"
QUESTIONS = ["What is the capital of France?", "Name a colour.", "Count to three."]


@pytest.fixture
def runner(app):
    from django.core.handlers.asgi import ASGIHandler

    from wire.batches.runner import BatchRunner

    made = []

    def start(concurrency: int = 2) -> BatchRunner:
        r = BatchRunner(app=ASGIHandler(), concurrency=concurrency, poll_s=0.05)
        r.start()
        made.append(r)
        return r

    yield start
    for r in made:
        r.stop()


def chat_body(question: str, **extra) -> dict:
    return {
        "messages": [{"role": "user", "content": question}],
        "temperature": 0,
        "max_tokens": 5,
        **extra,
    }


def line(custom_id: str, body: dict, url: str = CHAT) -> dict:
    return {"custom_id": custom_id, "method": "POST", "url": url, "body": body}


def jsonl(lines) -> bytes:
    return b"".join((x if isinstance(x, bytes) else json.dumps(x).encode()) + b"\n" for x in lines)


async def wait_for(client, batch_id: str, statuses=("completed", "failed", "cancelled")):
    for _ in range(3000):
        batch = await client.batches.retrieve(batch_id)
        if batch.status in statuses:
            return batch
        await asyncio.sleep(0.1)
    raise AssertionError(f"batch still {batch.status}")


def blank(body: dict) -> dict:
    body = dict(body)
    body.pop("id", None)
    body.pop("created", None)
    body.pop("system_fingerprint", None)
    return body


async def test_a_mixed_batch_answers_as_the_direct_requests_and_lists_bad_lines(
    app, files_dir, runner
):
    key = await new_key("a")
    client = sdk(app, key)
    good = [line(f"q{i}", chat_body(q)) for i, q in enumerate(QUESTIONS)]
    good += [line(f"e{i}", {"input": q}, EMBED) for i, q in enumerate(QUESTIONS)]
    bad = [
        line("bad-temp", chat_body("hi", temperature="hot")),
        line("bad-messages", {"messages": "nope"}),
        line("bad-stream", chat_body("hi", stream=True)),
        line("bad-input", {"input": 5}, EMBED),
    ]
    source = await client.files.create(file=("in.jsonl", jsonl(good + bad)), purpose="batch")
    runner()
    made = await client.batches.create(
        input_file_id=source.id, endpoint=CHAT, completion_window="24h", metadata={"job": "t"}
    )
    assert made.status == "validating" and made.metadata == {"job": "t"}
    done = await wait_for(client, made.id)
    assert done.status == "completed", done
    counts = done.request_counts
    assert (counts.total, counts.completed, counts.failed) == (10, 6, 4)
    output = await lines_of(client, done.output_file_id)
    errors = await lines_of(client, done.error_file_id)
    assert sorted(e["custom_id"] for e in errors) == sorted(b["custom_id"] for b in bad)
    assert {e["response"]["status_code"] for e in errors} == {400}
    by_id = {x["custom_id"]: x for x in good}
    assert sorted(o["custom_id"] for o in output) == sorted(by_id)
    for out in output:
        assert out["response"]["status_code"] == 200 and out["error"] is None
        sent = by_id[out["custom_id"]]
        direct = await raw_call(
            app, "POST", sent["url"], body=sent["body"], headers=bearer(key), timeout=300
        )
        assert blank(out["response"]["body"]) == blank(direct.json())


async def lines_of(client, file_id: str) -> list[dict]:
    text = (await client.files.content(file_id)).text
    return [json.loads(x) for x in text.splitlines()]


@pytest.mark.parametrize(
    "lines, code",
    [
        ([b"{not json"], "invalid_json_line"),
        ([line("a", chat_body("x")), line("a", chat_body("y"))], "duplicate_custom_id"),
        ([line("a", {"input": "x"}, "/v1/moderations")], "invalid_url"),
        ([line("a", chat_body("x", model="no-such-model"))], "model_not_found"),
        ([{"custom_id": "a", "method": "GET", "url": CHAT, "body": {}}], "invalid_method"),
    ],
)
async def test_bad_input_fails_the_batch_up_front(app, files_dir, runner, served, lines, code):
    if code == "model_not_found":  # one model routes any name: serve two
        from tests.conftest import SMOLLM2_NAME

        served.register("second-" + SMOLLM2_NAME, served.services()[SMOLLM2_NAME])
    client = sdk(app, await new_key("a"))
    source = await client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    runner()
    made = await client.batches.create(
        input_file_id=source.id, endpoint=CHAT, completion_window="24h"
    )
    done = await wait_for(client, made.id)
    assert done.status == "failed" and done.failed_at
    assert [e.code for e in done.errors.data] == [code]
    assert done.errors.data[0].line in (1, 2)


async def test_another_key_cannot_see_read_or_cancel_a_batch(app, files_dir, runner):
    owner, other = sdk(app, await new_key("a")), sdk(app, await new_key("b"))
    source = await owner.files.create(
        file=("in.jsonl", jsonl([line("a", chat_body("hi"))])), purpose="batch"
    )
    with pytest.raises(openai.NotFoundError):
        await other.batches.create(input_file_id=source.id, endpoint=CHAT, completion_window="24h")
    made = await owner.batches.create(
        input_file_id=source.id, endpoint=CHAT, completion_window="24h"
    )
    with pytest.raises(openai.NotFoundError):
        await other.batches.retrieve(made.id)
    with pytest.raises(openai.NotFoundError):
        await other.batches.cancel(made.id)
    assert (await other.batches.list()).data == []
    runner()
    done = await wait_for(owner, made.id)
    with pytest.raises(openai.NotFoundError):
        await other.files.content(done.output_file_id)
    with pytest.raises(openai.NotFoundError):
        await other.files.delete(done.output_file_id)
    assert [b.id for b in (await owner.batches.list()).data] == [made.id]


async def test_a_runner_stopped_mid_batch_is_resumed_by_the_next_and_nothing_runs_twice(
    app, files_dir, runner
):
    from tests.access.helpers import in_db
    from wire.batches.models import BatchLine

    client = sdk(app, await new_key("a"))
    lines = [line(f"r{i}", chat_body(QUESTIONS[i % 3] + " " * i)) for i in range(8)]
    source = await client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    made = await client.batches.create(
        input_file_id=source.id, endpoint=CHAT, completion_window="24h"
    )
    first = runner(concurrency=2)
    for _ in range(3000):
        batch = await client.batches.retrieve(made.id)
        if batch.request_counts.completed >= 3:
            break
        await asyncio.sleep(0.05)
    first.stop()  # as a crash: lines in flight stay running in the database
    running = await in_db(lambda: BatchLine.objects.filter(state="running").count())
    done_before = await in_db(
        lambda: set(BatchLine.objects.filter(state="done").values_list("custom_id", flat=True))
    )
    assert running <= 2 and len(done_before) >= 3
    runner(concurrency=2)
    done = await wait_for(client, made.id)
    assert done.status == "completed" and done.request_counts.completed == 8
    output = [
        json.loads(x) for x in (await client.files.content(done.output_file_id)).text.splitlines()
    ]
    assert sorted(o["custom_id"] for o in output) == sorted(x["custom_id"] for x in lines)


async def test_cancel_stops_the_batch_and_keeps_what_finished(app, files_dir, runner):
    client = sdk(app, await new_key("a"))
    lines = [line(f"c{i}", chat_body(QUESTIONS[i % 3], max_tokens=40)) for i in range(12)]
    source = await client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    made = await client.batches.create(
        input_file_id=source.id, endpoint=CHAT, completion_window="24h"
    )
    runner(concurrency=1)
    for _ in range(3000):
        batch = await client.batches.retrieve(made.id)
        if batch.request_counts.completed >= 1:
            break
        await asyncio.sleep(0.05)
    cancelling = await client.batches.cancel(made.id)
    assert cancelling.status in ("cancelling", "cancelled")
    done = await wait_for(client, made.id, ("cancelled",))
    kept = done.request_counts.completed
    assert 1 <= kept < 12 and done.cancelled_at
    output = (await client.files.content(done.output_file_id)).text.splitlines()
    assert len(output) == kept


async def test_a_batch_waits_while_no_model_is_served_then_runs(
    empty_runtime, smollm2_service, files_dir, settings
):
    """A restart still loading its model: the batch is not failed, nor its lines."""
    from django.core.asgi import get_asgi_application
    from django.core.handlers.asgi import ASGIHandler

    from access import keys
    from pantheon_site import stack
    from tests.conftest import SMOLLM2_NAME
    from wire.batches.runner import BatchRunner

    keys.forget_cache()
    app = stack.build(get_asgi_application())
    client = sdk(app, await new_key("a"))
    source = await client.files.create(
        file=("in.jsonl", jsonl([line("w", chat_body("hi"))])), purpose="batch"
    )
    made = await client.batches.create(
        input_file_id=source.id, endpoint=CHAT, completion_window="24h"
    )
    r = BatchRunner(app=ASGIHandler(), concurrency=1, poll_s=0.05)
    r.start()
    try:
        await asyncio.sleep(1.0)
        assert (await client.batches.retrieve(made.id)).status == "validating"
        empty_runtime.register(SMOLLM2_NAME, smollm2_service)
        done = await wait_for(client, made.id)
        assert done.status == "completed" and done.request_counts.completed == 1
    finally:
        r.stop()
        keys.forget_cache()


async def test_a_responses_batch_runs_every_line(app, files_dir, runner):
    """Responses lines share their key's implicit session id: run two at a time, none
    is refused for it."""
    client = sdk(app, await new_key("a"))
    body = {"temperature": 0, "max_output_tokens": 4}
    lines = [line(f"r{i}", {"input": q, **body}, "/v1/responses") for i, q in enumerate(QUESTIONS)]
    source = await client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    runner(concurrency=2)
    made = await client.batches.create(
        input_file_id=source.id, endpoint="/v1/responses", completion_window="24h"
    )
    done = await wait_for(client, made.id)
    assert (done.request_counts.completed, done.request_counts.failed) == (3, 0)
    output = await lines_of(client, done.output_file_id)
    assert {o["response"]["body"]["object"] for o in output} == {"response"}


async def test_a_batch_past_its_window_expires_with_its_lines_as_errors(app, files_dir, runner):
    from datetime import timedelta

    from django.utils import timezone

    from tests.access.helpers import in_db
    from wire.batches.models import Batch

    client = sdk(app, await new_key("a"))
    lines = [line(f"x{i}", chat_body("hi")) for i in range(3)]
    source = await client.files.create(file=("in.jsonl", jsonl(lines)), purpose="batch")
    made = await client.batches.create(
        input_file_id=source.id, endpoint=CHAT, completion_window="24h"
    )
    past = timezone.now() - timedelta(seconds=1)
    await in_db(lambda: Batch.objects.filter(id=made.id).update(expires_at=past))
    runner()
    done = await wait_for(client, made.id, ("expired",))
    assert done.expired_at and done.output_file_id is None
    errors = await lines_of(client, done.error_file_id)
    assert sorted(e["custom_id"] for e in errors) == ["x0", "x1", "x2"]
    assert {e["error"]["code"] for e in errors} == {"batch_expired"}


def test_metrics_count_batch_lines_by_state():
    from observability.metrics import BATCH_LINES, exposition

    BATCH_LINES.labels("completed").inc(0)
    body, _ = exposition()
    assert b'pantheon_batch_lines_total{state="completed"}' in body
