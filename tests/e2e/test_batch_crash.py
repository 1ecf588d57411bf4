"""A batch survives SIGKILL: the real server (Daphne, the real SmolLM2) runs a batch
through the unmodified OpenAI SDK, is killed mid-batch (no drain), and restarted on the
same data dir; the batch completes and every custom_id is in its output exactly once."""

from __future__ import annotations

import json
import signal
import time

import openai
import pytest

from tests.e2e.daphne_server import running_server

pytestmark = pytest.mark.timeout(600)

LINES = 16


def requests_jsonl() -> bytes:
    lines = [
        {
            "custom_id": f"k{i}",
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "messages": [{"role": "user", "content": f"Count from {i} to {i + 5}."}],
                "temperature": 0,
                "max_tokens": 24,
            },
        }
        for i in range(LINES)
    ]
    return b"".join(json.dumps(x).encode() + b"\n" for x in lines)


def wait(client, batch_id: str, done, timeout: float = 400):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        batch = client.batches.retrieve(batch_id)
        if done(batch):
            return batch
        time.sleep(0.2)
    raise AssertionError(f"batch {batch_id} stuck: {batch}")


def test_a_killed_server_finishes_the_batch_after_restart_with_no_line_twice(
    tmp_path_factory, smollm2_path
):
    data = tmp_path_factory.mktemp("pantheon-data")
    seed = {"smollm2": smollm2_path}
    env = {"PANTHEON_BATCH_CONCURRENCY": "2"}
    with running_server(data, seed, **env) as srv:
        client = openai.OpenAI(api_key="none", base_url=srv.url + "/v1", max_retries=0)
        source = client.files.create(file=("in.jsonl", requests_jsonl()), purpose="batch")
        batch = client.batches.create(
            input_file_id=source.id, endpoint="/v1/chat/completions", completion_window="24h"
        )
        wait(client, batch.id, lambda b: b.request_counts.completed >= 3)
        srv.proc.kill()
        assert srv.proc.wait(10) == -signal.SIGKILL
    with running_server(data, seed, **env) as srv:
        client = openai.OpenAI(api_key="none", base_url=srv.url + "/v1", max_retries=0)
        done = wait(client, batch.id, lambda b: b.status in ("completed", "failed"))
        assert done.status == "completed", done
        errors = client.files.content(done.error_file_id).text if done.error_file_id else ""
        assert (done.request_counts.completed, done.request_counts.failed) == (LINES, 0), errors
        output = client.files.content(done.output_file_id).text.splitlines()
        ids = [json.loads(line)["custom_id"] for line in output]
        assert sorted(ids) == sorted(f"k{i}" for i in range(LINES))
