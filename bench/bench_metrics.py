"""Decode throughput with the metrics on and off, in one run (issue 20: within noise).

Streamed chat completions go through the whole ASGI stack (pantheon_site.stack: the
access log that records them, the guard, Django, the chat view and its metered event
stream) on SmolLM2, `--streams` at once, `--tokens` greedy tokens each; while the metrics
are on, a scraper reads GET /metrics every second as Prometheus would. Rounds alternate
on and off (on, off, on, off, ...) so drift in the machine's load falls on both; the
result is each round's aggregate tokens per second from the first streamed byte to the
last, and the ratio of the medians (on / off). PANTHEON_METRICS=0 is the off path: no
metered stream, nothing recorded.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

KEY = "bench-metrics-key"
os.environ.setdefault("DJANGO_SETTINGS_MODULE", "pantheon_site.settings")
os.environ["PANTHEON_ADMIN_API_KEY"] = KEY  # an env key: the guard needs no database
os.environ.setdefault("PANTHEON_DATA_DIR", "/tmp/pantheon-bench-metrics")

import django  # noqa: E402

django.setup()

from django.conf import settings  # noqa: E402
from django.core.asgi import get_asgi_application  # noqa: E402

from bench.bench_engine import default_model_path  # noqa: E402
from engine.serving.service import ModelService  # noqa: E402
from engine.types import ModelConfig  # noqa: E402
from pantheon_platform.runtime import get_runtime  # noqa: E402
from pantheon_site import stack  # noqa: E402
from tests.support import asgi_scope  # noqa: E402

MODEL = "bench"


async def call(app, method: str, path: str, body: bytes = b"") -> tuple[int, list, list]:
    """One request through the ASGI app: (status, body chunks, their arrival times)."""
    scope = asgi_scope(method, path)
    scope["headers"].append((b"authorization", f"Bearer {KEY}".encode()))
    sent = False
    status, chunks, times = 0, [], []

    async def receive():
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        await asyncio.Event().wait()  # the client stays until the app is done

    async def send(message):
        nonlocal status
        if message["type"] == "http.response.start":
            status = message["status"]
        elif message.get("body"):
            chunks.append(message["body"])
            times.append(time.perf_counter())

    await app(scope, receive, send)
    return status, chunks, times


def completion_tokens(chunks: list[bytes]) -> int:
    for event in reversed(b"".join(chunks).decode().split("\n\n")):
        data = event.removeprefix("data: ").strip()
        if data.startswith("{") and '"usage"' in data:
            usage = json.loads(data).get("usage")
            if usage:
                return usage["completion_tokens"]
    raise RuntimeError("the stream carried no usage")


async def one_round(app, streams: int, tokens: int, scrape: bool) -> float:
    """Aggregate decode tok/s of `streams` streamed chats at once."""

    async def stream(i: int):
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"Count from {i + 1} to 1000."}],
            "max_tokens": tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        status, chunks, times = await call(
            app, "POST", "/v1/chat/completions", json.dumps(body).encode()
        )
        if status != 200:
            raise RuntimeError(f"chat answered {status}: {b''.join(chunks)[:300]!r}")
        return completion_tokens(chunks), times[0], times[-1]

    async def scraper(stop: asyncio.Event):
        while not stop.is_set():
            status, _, _ = await call(app, "GET", "/metrics")
            assert status == 200, status
            try:
                await asyncio.wait_for(stop.wait(), 1.0)
            except TimeoutError:
                pass

    stop = asyncio.Event()
    scraping = asyncio.create_task(scraper(stop)) if scrape else None
    results = await asyncio.gather(*(stream(i) for i in range(streams)))
    stop.set()
    if scraping is not None:
        await scraping
    generated = sum(n for n, _, _ in results)
    first = min(t0 for _, t0, _ in results)
    last = max(t1 for _, _, t1 in results)
    return generated / (last - first)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--streams", type=int, default=4, help="streams at once")
    ap.add_argument("--tokens", type=int, default=128, help="greedy tokens per stream")
    ap.add_argument("--rounds", type=int, default=5, help="rounds with the metrics on (and off)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args()

    svc = ModelService.load(
        ModelConfig(name=MODEL, path=default_model_path(), max_concurrent=max(4, args.streams))
    )
    get_runtime().register(MODEL, svc)
    app = stack.build(get_asgi_application())

    async def run() -> dict[str, list[float]]:
        settings.PANTHEON_METRICS = True
        await one_round(app, min(2, args.streams), 8, scrape=False)  # warm-up
        rates: dict[str, list[float]] = {"on": [], "off": []}
        for _ in range(args.rounds):
            for mode in ("on", "off"):
                settings.PANTHEON_METRICS = mode == "on"
                rates[mode].append(
                    await one_round(app, args.streams, args.tokens, scrape=mode == "on")
                )
        return rates

    load_before = os.getloadavg()[0]
    rates = asyncio.run(run())
    svc.close()
    on, off = statistics.median(rates["on"]), statistics.median(rates["off"])
    result = {
        "streams": args.streams,
        "tokens": args.tokens,
        "rounds": args.rounds,
        "load_avg_1m": load_before,
        "on_tok_s": [round(r, 1) for r in rates["on"]],
        "off_tok_s": [round(r, 1) for r in rates["off"]],
        "median_on_tok_s": round(on, 1),
        "median_off_tok_s": round(off, 1),
        "ratio_on_to_off": round(on / off, 3),
    }
    if args.json:
        print(json.dumps(result))
        return
    print(
        f"{args.streams} streams x {args.tokens} greedy tokens, {args.rounds} rounds each way, "
        f"through the ASGI stack; 1-min load average before: {load_before:.2f}"
    )
    print(f"metrics on  (scraped every 1 s): {result['on_tok_s']} tok/s, median {on:.1f}")
    print(f"metrics off (PANTHEON_METRICS=0): {result['off_tok_s']} tok/s, median {off:.1f}")
    print(f"on / off: {result['ratio_on_to_off']:.3f}")


if __name__ == "__main__":
    main()
