"""Hostile requests over a real Daphne server never stall the others (issue 18, defects 1
and 2): while a pathological `response_format` pattern is checked, or a 30 MB prompt is
parsed, rendered and refused, `GET /` keeps answering and a running stream keeps its
pace.

What is measured, while the bad request is in flight: the largest gap between two
consecutive SSE events of a stream that was already running, and the slowest of many
`GET /` probes. Each is held to LATENCY_BOUND_S (the issue's 100 ms) on top of what the
same measurement shows in the seconds before, with no bad request in flight (a loaded
2-core machine has gaps of its own: see `allowed`); before the fix the stalls were whole
seconds (the pattern: 2**25 steps of Python's `re` under the GIL, on the engine thread;
the prompt: 30 s of tokenizing on the event loop).
"""

from __future__ import annotations

import json
import threading
import time

import httpx
import pytest

from tests.e2e.daphne_server import Server, running_server

MODEL = "smollm2-135m-instruct"
COUNT = [{"role": "user", "content": "Count from 1 to 1000, separated by commas."}]
LATENCY_BOUND_S = 0.1
PROBE_EVERY_S = 0.02
BASELINE_S = 3.0
# What a 30 MB body costs the interpreter however it is handled: Daphne hands it to the
# application in 8 KB pieces in one synchronous loop, and the JSON parse of a 30 MB string
# is one C call; each holds the GIL for ~50 ms on an idle machine, several times that on a
# loaded one. (Before the fix the stall was the whole tokenization: 30 s.)
BODY_ALLOWANCE_S = 0.5

pytestmark = pytest.mark.timeout(600)


@pytest.fixture(scope="module")
def server(tmp_path_factory, smollm2_path):
    data_dir = tmp_path_factory.mktemp("pantheon-data")
    # Small prefill chunks: a newcomer's prompt is prefilled between the watched stream's
    # decode steps, and a 256-token chunk alone takes ~0.2-0.5 s here. With 32-token
    # chunks what the 100 ms bound sees is a freeze, not the scheduler's normal turn-taking.
    with running_server(
        data_dir, {MODEL: smollm2_path}, PANTHEON_MAX_CONCURRENT="4", PANTHEON_PREFILL_CHUNK="32"
    ) as srv:
        srv.never_end = _ban_turn_ends(smollm2_path)
        yield srv


def _ban_turn_ends(path) -> dict[str, float]:
    """logit_bias that keeps the watched stream from ending its turn early: it must still
    be running when the hostile request arrives, however fast the engine decodes."""
    from engine.loading.gguf_file import GGUFFile
    from engine.text.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_gguf(GGUFFile(path).metadata)
    return {str(i): -100.0 for i in tokenizer.end_of_turn_ids}


class Watch:
    """A long stream already running, and GET / probed every PROBE_EVERY_S: when each SSE
    event arrived, and when each probe started and how long it took."""

    def __init__(self, server: Server):
        self.server = server
        self.events: list[float] = []
        self.probes: list[tuple[float, float]] = []
        self.stop = threading.Event()
        self.streaming = threading.Event()
        self.threads = [
            threading.Thread(target=self._stream, daemon=True),
            threading.Thread(target=self._probe, daemon=True),
        ]

    def __enter__(self) -> Watch:
        for thread in self.threads:
            thread.start()
        assert self.streaming.wait(120), "the watched stream never started"
        time.sleep(BASELINE_S)  # a baseline before anything hostile is sent
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)

    def _stream(self) -> None:
        body = {
            "messages": COUNT,
            "max_tokens": 2000,
            "temperature": 0,
            "stream": True,
            "logit_bias": getattr(self.server, "never_end", {}),
        }
        with httpx.stream(
            "POST", self.server.url + "/v1/chat/completions", json=body, timeout=300
        ) as r:
            assert r.status_code == 200
            for line in r.iter_lines():
                if line.startswith("data: "):
                    self.events.append(time.monotonic())
                    self.streaming.set()
                if self.stop.is_set():
                    return

    def _probe(self) -> None:
        with httpx.Client(timeout=60) as client:
            while not self.stop.is_set():
                started = time.monotonic()
                assert client.get(self.server.url + "/").status_code == 200
                self.probes.append((started, time.monotonic() - started))
                time.sleep(PROBE_EVERY_S)

    def max_gap(self, start: float, end: float) -> float:
        """The largest gap between consecutive events with one of them inside [start, end]."""
        times = self.events
        gaps = [b - a for a, b in zip(times, times[1:], strict=False) if b >= start and a <= end]
        assert gaps, "the stream sent nothing in the window"
        return max(gaps)

    def slowest_probe(self, start: float, end: float) -> float:
        took = [t for s, t in self.probes if start <= s + t and s <= end]
        assert took, "no GET / probe in the window"
        return max(took)


def assert_nothing_stalled(
    watch: Watch, baseline: tuple[float, float], window, extra_s: float = 0.0
) -> None:
    """Neither the stream nor GET / stalled in `window` past `allowed` of its baseline
    (plus `extra_s`)."""
    start, end = window
    gap, probe = watch.max_gap(start, end), watch.slowest_probe(start, end)
    base_gap, base_probe = baseline
    report = (
        f"largest stream gap {gap * 1000:.0f} ms (baseline {base_gap * 1000:.0f} ms), "
        f"slowest GET / {probe * 1000:.0f} ms (baseline {base_probe * 1000:.0f} ms)"
    )
    assert gap <= allowed(base_gap) + extra_s, report
    assert probe <= allowed(base_probe) + extra_s, report


def allowed(base: float) -> float:
    """LATENCY_BOUND_S over the baseline; where the machine is so loaded that the baseline
    itself is long (a decode step of a second), a quarter of it more is still noise."""
    return base + max(LATENCY_BOUND_S, base / 4)


def baseline(watch: Watch) -> tuple[float, float]:
    """(largest stream gap, slowest GET /) of the BASELINE_S before now."""
    now = time.monotonic()
    return watch.max_gap(now - BASELINE_S, now), watch.slowest_probe(now - BASELINE_S, now)


def settle() -> None:
    time.sleep(0.5)  # the gap and the probes that straddle a window's end have arrived


# A schema whose own check backtracked without bound in Python's `re`: the answer is 25
# a's (the grammar enforces the first pattern), and `(a+)+b` on it took seconds under the
# GIL, doubling with each a.
CATASTROPHIC = {
    "type": "string",
    "pattern": "^a{25}$",
    "not": {"pattern": "(a+)+b"},
}
# One that even the `regex` engine cannot settle in time: the check gives up.
TIMES_OUT = {
    "type": "string",
    "pattern": "^a{40}b$",
    "not": {"pattern": "^(a|a)*$"},
}


def schema_request(schema: dict) -> dict:
    return {
        "messages": [{"role": "user", "content": "Write the string."}],
        "temperature": 0,
        "max_tokens": 60,
        "response_format": {"type": "json_schema", "json_schema": {"name": "s", "schema": schema}},
    }


def stream_schema_request(server: Server, schema: dict) -> tuple[list, tuple[float, float]]:
    """The request streamed: (its chunks, the window from its first token to its closing
    chunk: the answer's check runs just before the closing chunk; the prompt's prefill,
    which any request costs the others, is over before the first token)."""
    chunks: list[tuple[float, dict]] = []
    with httpx.stream(
        "POST",
        server.url + "/v1/chat/completions",
        json={**schema_request(schema), "stream": True},
        timeout=120,
    ) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if line.startswith("data: {"):
                chunks.append((time.monotonic(), json.loads(line[6:])))
    first = next(t for t, c in chunks if c["choices"][0]["delta"].get("content"))
    closing = next(t for t, c in chunks if c["choices"][0]["finish_reason"])
    return [c for _, c in chunks], (first, closing)


def streamed_answer(chunks: list) -> tuple[str, dict]:
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
    closing = next(c for c in chunks if c["choices"][0]["finish_reason"])
    return text, closing


def test_a_pathological_pattern_stalls_nobody(server):
    with Watch(server) as watch:
        before = baseline(watch)
        chunks, (start, end) = stream_schema_request(server, CATASTROPHIC)
        settle()
        assert_nothing_stalled(watch, before, (start, end))
    text, closing = streamed_answer(chunks)
    assert json.loads(text) == "a" * 25
    # `not` is beyond the grammar (downgraded), but the check ran, and the answer passed.
    assert closing["response_format_status"] == "schema_downgraded"


def test_a_pattern_check_that_times_out_says_so_and_stalls_nobody(server):
    with Watch(server) as watch:
        before = baseline(watch)
        chunks, (start, end) = stream_schema_request(server, TIMES_OUT)
        settle()
        assert_nothing_stalled(watch, before, (start, end))
    text, closing = streamed_answer(chunks)
    assert json.loads(text) == "a" * 40 + "b"
    assert closing["response_format_status"] == "not_enforced"
    assert "timed out" in closing["response_format_message"]


def test_a_30_mb_prompt_is_refused_and_stalls_nobody(server):
    content = "hello world " * (30_000_000 // 12)
    payload = json.dumps({"messages": [{"role": "user", "content": content}]}).encode()
    with Watch(server) as watch:
        before = baseline(watch)
        start = time.monotonic()
        response = httpx.post(
            server.url + "/v1/chat/completions",
            content=payload,
            headers={"Content-Type": "application/json"},
            timeout=120,
        )
        end = time.monotonic()
        settle()
        assert_nothing_stalled(watch, before, (start, end), extra_s=BODY_ALLOWANCE_S)
    assert response.status_code == 400, response.text
    error = response.json()["error"]
    assert error["type"] == "context_over_budget"
    assert error["code"] == "context_length_exceeded"
    assert "at least" in error["message"]
